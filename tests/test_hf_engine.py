"""The transformers rollout backend (grpo_dist/rollout/hf_engine.py) on its own: one batched,
left-padded decode loop with a KV cache over all prompts x samples (fast, tiny untrained model).

What it must keep from the per-prompt ``model.generate`` it replaced: behaviour log-probs equal
the learner's recompute, a seeded sample depends on its seed only, greedy equals transformers'
greedy, eos and stop strings end a row (and only that row), adapters and full weights load.
"""

from __future__ import annotations

import pytest
import torch

from grpo_dist.rollout.base import SamplingSpec

TEXTS = ["1+1=", "12+345=", "7777+8888=", "5*6="]  # different lengths: left padding in every batch


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    from grpo_dist.rollout.hf_engine import HFGenerator

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield HFGenerator(str(tiny_model_dir), seed=0)
    torch.set_num_threads(n)


def prompts(engine, texts=TEXTS):
    return engine.tokenize(texts)


def seeds_for(n_prompts: int, n: int, base: int = 0):
    return [[base + 100 * i + j for j in range(n)] for i in range(n_prompts)]


def recompute(model, prompt, completion, temperature: float = 1.0) -> torch.Tensor:
    """The learner's view: one full forward of prompt + completion, log_softmax(logits / T)."""
    dev = next(model.parameters()).device
    with torch.no_grad():
        logits = model(torch.tensor([prompt + completion], device=dev)).logits[0].float()
    lp = torch.log_softmax(logits / temperature, -1)
    p = len(prompt)
    return lp[p - 1:p - 1 + len(completion)].gather(-1, torch.tensor(completion, device=dev)[:, None]).squeeze(-1)


def max_logprob_error(model, ps, out, temperature: float) -> float:
    err = 0.0
    for p, group in zip(ps, out):
        for s in group:
            assert len(s.logprobs) == len(s.token_ids) >= 1
            want = recompute(model, p, s.token_ids, temperature).cpu()
            err = max(err, (want - torch.tensor(s.logprobs)).abs().max().item())
    return err


@pytest.mark.parametrize("seeded", [True, False])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_batched_logprobs_equal_the_learner_recompute(engine, seeded, temperature):
    ps = prompts(engine)
    spec = SamplingSpec(n=3, temperature=temperature, max_tokens=12)
    out = engine.generate(ps, spec, seeds=seeds_for(len(ps), 3) if seeded else None)
    assert [len(g) for g in out] == [3] * len(ps)
    assert max_logprob_error(engine.base, ps, out, temperature) < 1e-4
    assert len({tuple(s.token_ids) for g in out for s in g}) > 1


def test_top_k_top_p_logprobs_are_the_processed_distribution(engine):
    """With top-k/top-p the log-probs are those of transformers' warpers (renormalised over the kept
    tokens), and every sampled token is one the warpers keep."""
    from transformers.generation.logits_process import TopKLogitsWarper, TopPLogitsWarper

    ps = prompts(engine)
    spec = SamplingSpec(n=4, temperature=0.8, top_k=20, top_p=0.9, max_tokens=10)
    out = engine.generate(ps, spec, seeds=seeds_for(len(ps), 4))
    for p, group in zip(ps, out):
        for s in group:
            with torch.no_grad():
                logits = engine.base(torch.tensor([p + s.token_ids])).logits[0, len(p) - 1:-1].float() / 0.8
            x = TopPLogitsWarper(0.9)(None, TopKLogitsWarper(20)(None, logits))
            want = torch.log_softmax(x, -1).gather(-1, torch.tensor(s.token_ids)[:, None]).squeeze(-1)
            assert torch.isfinite(want).all()
            assert (want - torch.tensor(s.logprobs)).abs().max().item() < 1e-4


def test_seeded_samples_do_not_depend_on_the_batch(engine):
    """Prompt i's samples are the same alone, in a batch with prompts of other lengths, in another
    order, and when the batch is cut into chunks (max_batch_size)."""
    ps = prompts(engine)
    spec = SamplingSpec(n=3, temperature=1.0, max_tokens=10)
    seeds = seeds_for(len(ps), 3, base=7)
    batch = [[s.token_ids for s in g] for g in engine.generate(ps, spec, seeds=seeds)]
    alone = [[s.token_ids for s in engine.generate([p], spec, seeds=[sd])[0]] for p, sd in zip(ps, seeds)]
    rev = [[s.token_ids for s in g] for g in engine.generate(ps[::-1], spec, seeds=seeds[::-1])][::-1]
    old = engine.max_batch_size
    try:
        engine.max_batch_size = 4  # one prompt (3 rows) per chunk
        chunked = [[s.token_ids for s in g] for g in engine.generate(ps, spec, seeds=seeds)]
    finally:
        engine.max_batch_size = old
    assert batch == alone == rev == chunked
    assert all(len({tuple(c) for c in g}) > 1 for g in batch)  # the n seeds give different samples
    # a sample depends on its own seed only: swapping two seeds swaps the two samples
    a, b, c = seeds[0]
    swapped = [s.token_ids for s in engine.generate(ps[:1], spec, seeds=[[b, a, c]])[0]]
    assert swapped == [batch[0][1], batch[0][0], batch[0][2]]


def test_unseeded_calls_advance_the_engine_stream(engine):
    ps = prompts(engine)
    spec = SamplingSpec(n=2, temperature=1.0, max_tokens=8)
    a = [[s.token_ids for s in g] for g in engine.generate(ps, spec)]
    b = [[s.token_ids for s in g] for g in engine.generate(ps, spec)]
    assert a != b


def test_greedy_equals_transformers_generate(engine):
    ps = prompts(engine)
    out = engine.generate(ps, SamplingSpec(n=2, temperature=0.0, max_tokens=16))
    for p, group in zip(ps, out):
        ids = torch.tensor([p])
        ref = engine.base.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=16, do_sample=False)
        assert len(group) == 2 and group[0].token_ids == group[1].token_ids == ref[0, len(p):].tolist()
        assert group[0].finish_reason == "length" and len(group[0].token_ids) == 16
        want = recompute(engine.base, p, group[0].token_ids, 1.0)
        assert (want - torch.tensor(group[0].logprobs)).abs().max().item() < 1e-4


def test_stop_strings_end_only_their_row(engine):
    """A row stops at the first token whose text completes a stop string (kept, like the old
    backend's ``stop_strings``); the other rows go on exactly as without stop strings."""
    ps = prompts(engine)
    spec = SamplingSpec(n=4, temperature=1.0, max_tokens=14)
    seeds = seeds_for(len(ps), 4, base=3)
    free = engine.generate(ps, spec, seeds=seeds)
    stop = next(s.text for g in free for s in g if len(s.text) >= 8)[4:6]  # a string some row produces mid-way
    spec_stop = SamplingSpec(n=4, temperature=1.0, max_tokens=14, stop=[stop])
    out = engine.generate(ps, spec_stop, seeds=seeds)
    n_stopped = 0
    for gf, gs in zip(free, out):
        for f, s in zip(gf, gs):
            k = len(s.token_ids)
            assert s.token_ids == f.token_ids[:k] and s.logprobs == pytest.approx(f.logprobs[:k], abs=1e-5)
            if stop in f.text:
                dec = engine.tokenizer.decode
                cut = next(j for j in range(1, len(f.token_ids) + 1) if stop in dec(f.token_ids[:j]))
                assert len(s.token_ids) == cut and s.finish_reason == "stop" and s.text.endswith(stop)
                n_stopped += 1
            else:
                assert s.token_ids == f.token_ids and s.finish_reason == f.finish_reason
    assert 1 <= n_stopped < 4 * len(ps)


def test_eos_ends_a_row_and_is_kept(engine, tiny_model_dir, tmp_path):
    """An eos token (here: a second eos id in the generation config, as chat models have) ends its
    row, is the row's last token, and the other rows are not disturbed."""
    from transformers import AutoModelForCausalLM

    from grpo_dist.rollout.hf_engine import HFGenerator

    ps = prompts(engine)
    spec = SamplingSpec(n=4, temperature=1.0, max_tokens=12)
    seeds = seeds_for(len(ps), 4, base=11)
    free = engine.generate(ps, spec, seeds=seeds)
    eos_tok = free[1][0].token_ids[5]  # a token sample 0 of prompt 1 draws at step 5
    m = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    m.generation_config.eos_token_id = [engine.tokenizer.eos_token_id, eos_tok]
    m.save_pretrained(tmp_path)
    engine.tokenizer.save_pretrained(tmp_path)
    g = HFGenerator(str(tmp_path), seed=0)
    out = g.generate(ps, spec, seeds=seeds)
    n_stopped = 0
    for gf, gs in zip(free, out):
        for f, s in zip(gf, gs):
            if eos_tok in f.token_ids:
                cut = f.token_ids.index(eos_tok) + 1
                assert s.token_ids == f.token_ids[:cut] and s.finish_reason == "stop"
                n_stopped += 1
            else:
                assert s.token_ids == f.token_ids and s.finish_reason == f.finish_reason
    assert 1 <= n_stopped < 4 * len(ps)


def test_adapter_and_full_weights(engine, tiny_model_dir, tmp_path):
    """LoRA adapter (set_adapter), back to the base model, and full weights (load_full_weights):
    the batched log-probs follow the served weights."""
    from peft import LoraConfig, get_peft_model
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM

    from grpo_dist.rollout.hf_engine import HFGenerator

    g = HFGenerator(str(tiny_model_dir), seed=0)
    ps = prompts(g)
    spec = SamplingSpec(n=2, temperature=1.0, max_tokens=8)
    seeds = seeds_for(len(ps), 2)
    torch.manual_seed(0)
    lora = get_peft_model(AutoModelForCausalLM.from_pretrained(tiny_model_dir),
                          LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"], init_lora_weights=False))
    lora.save_pretrained(tmp_path / "adapter")
    g.set_adapter(1, str(tmp_path / "adapter"))
    out = g.generate(ps, spec, seeds=seeds)
    assert max_logprob_error(lora, ps, out, 1.0) < 1e-4
    g.set_adapter(0, None)
    base_out = g.generate(ps, spec, seeds=seeds)
    assert max_logprob_error(engine.base, ps, base_out, 1.0) < 1e-4
    assert [s.logprobs for grp in out for s in grp] != [s.logprobs for grp in base_out for s in grp]

    full = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    with torch.no_grad():
        for p in full.parameters():
            p.add_(0.02 * torch.randn_like(p))
    (tmp_path / "full").mkdir()
    save_file({k: v.contiguous() for k, v in full.state_dict().items()}, str(tmp_path / "full" / "model.safetensors"))
    g2 = HFGenerator(str(tiny_model_dir), seed=0)
    g2.load_full_weights(str(tmp_path / "full"))
    assert max_logprob_error(full, ps, g2.generate(ps, spec, seeds=seeds), 1.0) < 1e-4
