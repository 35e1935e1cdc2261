"""The DeepSpeed + PEFT learner on the tiny model (CPU, gloo, one process).

Gradient checks compare *gradients* (read after the reduction over micro-batches, before clipping
and Adam), not parameters after an Adam step: Adam's first update is ~lr * sign(grad), which would
hide a wrong global scale of the gradient (e.g. a missing / extra division by the number of
micro-batches).
"""

from __future__ import annotations

import json

import pytest
import torch

from grpo_dist.algo import grpo_loss
from grpo_dist.testing.learner import (loss_inputs, make_learner, random_batch, randomize_lora, small_config,
                                      train_step_with_grads)
from grpo_dist.types import TrainBatch

pytestmark = pytest.mark.usefixtures("in_process_learners")
make_cfg = small_config
make_batch = random_batch


@pytest.fixture(scope="module")
def fresh(tiny_model_dir):
    """A learner with its state right after setup (version 0), shared by the tests below."""
    learner, info = make_learner(make_cfg(tiny_model_dir, algo=dict(beta=0.04)))
    initial = learner.export_update()
    return learner, info, initial


def test_setup_and_initial_export(fresh):
    learner, info, up = fresh
    assert up.version == 0 and learner.version == 0
    assert info["trainable_params"] < info["total_params"] and info["adapter_bytes"] == up.nbytes
    assert up.tensors and all("lora_" in k for k in up.tensors)
    assert up.nbytes < 1_000_000
    assert all(t.device.type == "cpu" and t.is_contiguous() for t in up.tensors.values())
    assert all(float(t.abs().max()) == 0.0 for k, t in up.tensors.items() if "lora_B" in k)
    cfg = up.peft_config
    assert cfg["r"] == 8 and cfg["lora_alpha"] == 16.0 and "q_proj" in cfg["target_modules"]
    json.dumps(cfg)  # JSON-safe (target_modules was a set)


def test_first_step_loss_is_minus_mean_advantage(fresh):
    """Seed 000: at step 1 policy == reference (LoRA B = 0), so ratio = 1, KL = 0, loss = -mean(A)."""
    learner, _, _ = fresh
    m = learner.train_step(make_batch(8, seed=1, advantages=[2.0] * 8))
    assert m["train/loss"] == pytest.approx(-2.0, abs=1e-6)
    assert m["train/kl"] == pytest.approx(0.0, abs=1e-7)
    assert m["train/loss_kl"] == pytest.approx(0.0, abs=1e-7)
    assert m["train/ratio_mean"] == pytest.approx(1.0, abs=1e-6)
    assert m["train/grad_norm"] > 0 and m["train/lr"] == pytest.approx(2e-3)
    assert learner.version == 1
    assert all(isinstance(v, float) for v in m.values())


def test_learning_direction_and_export_changes(fresh):
    learner, _, initial = fresh
    batch = make_batch(8, seed=2, advantages=[1.0, -1.0] * 4)
    before = [sum(x) for x in learner.compute_logprobs(batch)]
    v0 = learner.version
    for _ in range(3):
        learner.train_step(batch)
    after = [sum(x) for x in learner.compute_logprobs(batch)]
    assert learner.version == v0 + 3
    assert all(a > b for a, b, adv in zip(after, before, batch.advantages) if adv > 0)
    assert all(a < b for a, b, adv in zip(after, before, batch.advantages) if adv < 0)
    up = learner.export_update()
    assert up.version == learner.version and set(up.tensors) == set(initial.tensors)
    assert any(not torch.equal(up.tensors[k], initial.tensors[k]) for k in up.tensors)


def test_behaviour_logprob_agreement_and_hook(fresh):
    learner, _, _ = fresh
    batch = make_batch(8, seed=3)
    batch.behaviour_logprobs = learner.compute_logprobs(batch)
    assert [len(x) for x in batch.behaviour_logprobs] == [len(c) for c in batch.completion_ids]
    m = learner.train_step(batch)
    assert m["train/logprob_diff_behaviour_max"] < 1e-5
    assert m["train/logprob_diff_behaviour_mean"] < 1e-5
    # Async hook: old_logp = the rollout's log-probs (one line to switch); here they are exact.
    batch.behaviour_logprobs = learner.compute_logprobs(batch)
    learner.old_logp_source = "behaviour"
    try:
        m = learner.train_step(batch)
    finally:
        learner.old_logp_source = "policy"
    assert m["train/ratio_mean"] == pytest.approx(1.0, abs=1e-5)


def test_logprobs_match_transformers_with_temperature(tiny_model_dir):
    """Alignment (logits at t score token t+1) and temperature scaling vs a plain HF forward."""
    from transformers import AutoModelForCausalLM

    learner, _ = make_learner(make_cfg(tiny_model_dir, rollout=dict(temperature=0.7), algo=dict(beta=0.0)))
    batch = make_batch(8, seed=4)
    got = learner.compute_logprobs(batch)
    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float32).eval()
    for p, c, lp in zip(batch.prompt_ids, batch.completion_ids, got):
        ids = torch.tensor([p + c])
        with torch.no_grad():
            logits = model(input_ids=ids).logits[0] / 0.7
        ref = torch.log_softmax(logits, -1)[len(p) - 1:len(p) - 1 + len(c)].gather(-1, torch.tensor(c)[:, None])
        assert torch.allclose(torch.tensor(lp), ref.squeeze(-1), atol=1e-5)


def _manual_whole_batch_grads(learner, batch, cfg):
    """Plain autograd on the PEFT module (no DeepSpeed): the single-process whole-batch gradient."""
    a = cfg.algo
    mb = learner.layout.collate(batch)
    module = learner.engine.module
    logp, _ = learner.policy.forward(mb, module)
    ref = learner.policy.logprobs_nograd(mb, reference=True)
    loss, _ = grpo_loss(logp, logp.detach(), ref, mb.advantages, mb.mask, beta=a.beta, clip_low=a.clip_low,
                        clip_high=a.clip_high, kl_kind=a.kl_kind, agg=a.agg, max_len=cfg.rollout.max_tokens)
    named = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
    grads = torch.autograd.grad(loss, [p for _, p in named])
    return {n: g.detach().clone() for (n, _), g in zip(named, grads)}, float(loss.detach())


@pytest.mark.parametrize("agg", ["seq-mean-token-mean", "token-mean"])
def test_gradient_accumulation_equivalence(tiny_model_dir, agg):
    """micro_batch_size 8 (1 micro-batch) vs 2 (4 micro-batches) vs plain autograd on the whole
    batch: the same gradient, not just the same direction."""
    batch = make_batch(8, seed=5)
    results = []
    for mbs in (8, 2):
        cfg = make_cfg(tiny_model_dir, learner=dict(micro_batch_size=mbs), algo=dict(beta=0.04, agg=agg))
        learner, _ = make_learner(cfg)
        randomize_lora(learner, seed=7)
        if mbs == 2:
            manual, manual_loss = _manual_whole_batch_grads(learner, batch, cfg)
        results.append(train_step_with_grads(learner, batch))
    (g8, m8), (g2, m2) = results
    assert set(g8) == set(g2) == set(manual)
    assert m8["train/loss"] == pytest.approx(m2["train/loss"], abs=1e-6)
    assert m2["train/loss"] == pytest.approx(manual_loss, abs=1e-6)
    for k in g8:
        assert float(g8[k].abs().max()) > 0, k
        torch.testing.assert_close(g2[k], g8[k], rtol=1e-5, atol=1e-7)
        torch.testing.assert_close(manual[k], g8[k], rtol=1e-5, atol=1e-7)
    assert m8["train/grad_norm"] == pytest.approx(m2["train/grad_norm"], rel=1e-5)


def test_checkpoint_round_trip(tiny_model_dir, tmp_path):
    from peft import PeftModel, get_peft_model_state_dict
    from transformers import AutoModelForCausalLM

    cfg = make_cfg(tiny_model_dir, learner=dict(lr_schedule="cosine", warmup_steps=2))
    a, _ = make_learner(cfg)
    batch = make_batch(8, seed=6)
    for _ in range(2):
        a.train_step(batch)
    a.save_checkpoint(tmp_path / "ckpt", {"step": 2, "note": "x"})
    up_a = a.export_update()

    b, _ = make_learner(make_cfg(tiny_model_dir, learner=dict(lr_schedule="cosine", warmup_steps=2)))
    assert b.load_checkpoint(tmp_path / "ckpt") == {"step": 2, "note": "x"}
    up_b = b.export_update()
    assert b.version == a.version == up_b.version == 2
    assert set(up_a.tensors) == set(up_b.tensors)
    for k in up_a.tensors:
        assert torch.equal(up_a.tensors[k], up_b.tensors[k]), k
    assert a.compute_logprobs(batch) == b.compute_logprobs(batch)
    # Optimizer and scheduler state came back too: the next step is identical.
    ma, mb = a.train_step(batch), b.train_step(batch)
    assert ma["train/lr"] == mb["train/lr"] and ma["train/loss"] == pytest.approx(mb["train/loss"], abs=1e-7)
    up_a2, up_b2 = a.export_update(), b.export_update()
    for k in up_a2.tensors:
        torch.testing.assert_close(up_a2.tensors[k], up_b2.tensors[k], rtol=0, atol=1e-7)

    base = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float32)
    peft_model = PeftModel.from_pretrained(base, str(tmp_path / "ckpt" / "adapter"))
    loaded = get_peft_model_state_dict(peft_model)
    for k, v in up_a.tensors.items():
        assert torch.equal(loaded[k], v), k


def test_full_finetune_exports_hf_names(tiny_model_dir, tmp_path):
    from transformers import AutoModelForCausalLM

    learner, info = make_learner(make_cfg(tiny_model_dir, lora=dict(enabled=False), algo=dict(beta=0.04),
                                          learner=dict(lr=1e-3)))
    assert info["trainable_params"] == info["total_params"]
    up0 = learner.export_update()
    hf_keys = set(AutoModelForCausalLM.from_pretrained(str(tiny_model_dir)).state_dict())
    assert up0.peft_config is None and not up0.is_lora and set(up0.tensors) == hf_keys
    m = learner.train_step(make_batch(8, seed=8))
    assert m["train/kl"] == pytest.approx(0.0, abs=1e-7)  # frozen reference copy == policy at step 1
    up1 = learner.export_update()
    assert up1.version == 1 and any(not torch.equal(up0.tensors[k], up1.tensors[k]) for k in hf_keys)
    learner.save_adapter(tmp_path / "full")
    reloaded = AutoModelForCausalLM.from_pretrained(str(tmp_path / "full"))
    for k, v in reloaded.state_dict().items():
        assert torch.equal(v, up1.tensors[k]), k


VARIANTS = [
    dict(kl_kind="k1"), dict(kl_kind="k2"), dict(kl_kind="k3"), dict(kl_kind="low_var_kl"),
    dict(agg="token-mean"), dict(agg="seq-mean-token-sum"), dict(agg="seq-mean-token-sum-norm"),
    dict(agg="seq-mean-token-sum-norm", max_len=12), dict(ratio_level="sequence", clip_low=3e-4, clip_high=4e-4),
    dict(dual_clip=3.0, clip_high=0.28), dict(beta=0.0), dict(kl_reference="old", kl_kind="k1"),
    dict(loss="weighted_nll", beta=0.0, agg="seq-mean-token-sum"),
    dict(loss="weighted_nll", beta=0.1, kl_kind="k3", agg="token-mean"),
]


@pytest.fixture(scope="module")
def variant_learner(tiny_model_dir):
    learner, _ = make_learner(make_cfg(tiny_model_dir, learner=dict(micro_batch_size=2, lr=1e-3),
                                       rollout=dict(temperature=0.9)))
    randomize_lora(learner, seed=11)
    return learner


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: "-".join(f"{k}={v[k]}" for k in v))
def test_loss_variants_match_algo(variant_learner, variant):
    """train/loss (4 micro-batches, global counts) == grpo_dist.algo on the whole batch."""
    from grpo_dist.algo import aggregate, kl_penalty, weighted_nll_loss

    learner = variant_learner
    defaults = dict(loss="clip", beta=0.04, kl_kind="k3", kl_reference="ref", agg="seq-mean-token-mean",
                    max_len=None, ratio_level="token", clip_low=0.2, clip_high=0.2, dual_clip=None)
    for k, v in {**defaults, **variant}.items():
        setattr(learner.cfg.algo, k, v)
    a = learner.cfg.algo
    batch = make_batch(8, seed=12)
    t = loss_inputs(learner, batch)
    logp, mask, adv = t["logp"], t["mask"], t["advantages"]
    max_len = a.max_len or learner.cfg.rollout.max_tokens
    ref = t.get("ref_logp") if a.kl_reference == "ref" else logp
    if a.loss == "clip":
        expected, em = grpo_loss(logp, logp, ref if a.beta > 0 else None, adv, mask, beta=a.beta,
                                 clip_low=a.clip_low, clip_high=a.clip_high, dual_clip=a.dual_clip,
                                 kl_kind=a.kl_kind, agg=a.agg, max_len=max_len, ratio_level=a.ratio_level)
    else:
        per_token, em = weighted_nll_loss(logp, adv, mask)
        if a.beta > 0:
            per_token = per_token + a.beta * torch.where(mask.bool(), kl_penalty(logp, ref, a.kl_kind), 0.0)
        expected = aggregate(per_token, mask, a.agg, max_len=max_len)
    v0 = learner.version
    m = learner.train_step(batch)
    assert m["train/loss"] == pytest.approx(float(expected), abs=2e-6, rel=1e-5)
    assert learner.version == v0 + 1
    if a.beta > 0 and a.kl_reference == "ref":
        assert m["train/kl"] > 0 and m["train/loss_kl"] != 0
    if "kl_mean" in em and a.loss == "clip":
        assert m["train/kl"] == pytest.approx(em["kl_mean"], abs=1e-6, rel=1e-5)


def test_multiple_iterations(variant_learner):
    learner = variant_learner
    for k, v in dict(loss="clip", beta=0.04, kl_reference="ref", agg="seq-mean-token-mean", max_len=None,
                     ratio_level="token", clip_low=0.2, clip_high=0.2, dual_clip=None).items():
        setattr(learner.cfg.algo, k, v)
    learner.cfg.algo.num_iterations = 3
    try:
        v0 = learner.version
        m = learner.train_step(make_batch(8, seed=13))
    finally:
        learner.cfg.algo.num_iterations = 1
    assert learner.version == v0 + 3
    assert m["train/ratio_max"] > 1.0 or m["train/ratio_min"] < 1.0  # later updates are off-policy


def test_top_entropy_token_selection(variant_learner):
    """algo.top_entropy_frac: only the highest-entropy completion tokens carry loss; train/loss
    equals grpo_loss on the whole batch with the mask narrowed to those tokens."""
    learner = variant_learner
    for k, v in dict(loss="clip", beta=0.0, kl_reference="ref", agg="token-mean", max_len=None,
                     ratio_level="token", clip_low=0.2, clip_high=0.2, dual_clip=None).items():
        setattr(learner.cfg.algo, k, v)
    batch = make_batch(8, seed=21)
    t = loss_inputs(learner, batch)
    ent = learner.policy.logprobs_nograd(learner.layout.collate(batch), entropy=True)[1]
    mask = t["mask"]
    threshold = torch.quantile(ent[mask.bool()].float(), 0.5)
    narrowed = mask * (ent >= threshold).to(mask.dtype)
    assert 0 < narrowed.sum() < mask.sum()
    expected, _ = grpo_loss(t["logp"], t["logp"], None, t["advantages"], narrowed, beta=0.0, agg="token-mean")
    learner.cfg.algo.top_entropy_frac = 0.5
    try:
        m = learner.train_step(batch)
    finally:
        learner.cfg.algo.top_entropy_frac = 1.0
    assert m["train/entropy_selected_frac"] == pytest.approx(float(narrowed.sum() / mask.sum()))
    assert m["train/tokens"] == float(narrowed.sum())
    assert m["train/loss"] == pytest.approx(float(expected), abs=2e-6, rel=1e-5)


def test_lr_schedules():
    from grpo_dist.learner import lr_factor

    assert [lr_factor("constant", 2, 10)(s) for s in range(3)] == [0.5, 1.0, 1.0]
    lin = lr_factor("linear", 0, 4)
    assert [lin(s) for s in range(4)] == [1.0, 0.75, 0.5, 0.25]
    cos = lr_factor("cosine", 1, 5)
    assert cos(0) == 1.0 and cos(1) == 1.0 and cos(3) == pytest.approx(0.5) and cos(5) == pytest.approx(0.0)


def test_collate_alignment():
    from grpo_dist.learner import collate

    b = TrainBatch(prompt_ids=[[1, 5, 6], [1, 7]], completion_ids=[[8, 9], [10, 11, 12]],
                   behaviour_logprobs=[[-1.0, -2.0], [-3.0, -4.0, -5.0]], advantages=[1.0, -1.0],
                   loss_mask=[[1, 0], [1, 1, 1]])
    c = collate(b, pad_id=0)
    assert c.input_ids.tolist() == [[1, 5, 6, 8, 9], [1, 7, 10, 11, 12]]
    assert c.start == 1 and c.logits_to_keep == 4
    tgt = c.targets()
    for r, comp in enumerate(b.completion_ids):
        assert [tgt[r, c.index[r, j]].item() for j in range(len(comp))] == comp
    assert c.mask.tolist() == [[1, 0, 0], [1, 1, 1]] and c.valid.tolist() == [[True, True, False], [True] * 3]
    assert c.behaviour_logp.tolist() == [[-1.0, -2.0, 0.0], [-3.0, -4.0, -5.0]]


def test_collate_refuses_a_behaviour_row_of_the_wrong_length():
    from grpo_dist.learner import collate

    b = TrainBatch(prompt_ids=[[1, 5], [1, 7]], completion_ids=[[8, 9], [10, 11, 12]],
                   behaviour_logprobs=[[-1.0, -2.0], [-3.0, -4.0]], advantages=[1.0, -1.0])
    with pytest.raises(ValueError, match="behaviour_logprobs row 1 has 2 values for 3 completion tokens"):
        collate(b, pad_id=0)
    assert collate(b, rows=range(0, 1), pad_id=0).behaviour_logp.tolist() == [[-1.0, -2.0]]


@pytest.fixture(scope="module")
def zero0_run(tiny_model_dir):
    return _two_steps_and_refresh(tiny_model_dir, 0)


def _two_steps_and_refresh(model_dir, stage):
    learner, _ = make_learner(make_cfg(model_dir, learner=dict(zero_stage=stage),
                                       algo=dict(beta=0.04, ref_refresh_every=1)))
    batch = make_batch(8, seed=31)
    metrics = [learner.train_step(batch), learner.train_step(batch)]
    learner.refresh_reference(1.0)
    metrics.append(learner.train_step(batch))
    return metrics, learner.export_update()


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_zero_stages_train_like_stage_0(zero0_run, tiny_model_dir, stage):
    """ZeRO 1-3 (optimizer / gradient / parameter partitioning, one rank here): the same losses,
    the same adapter after 3 updates, and the reference refresh and export work with partitioned
    parameters (stage 3 gathers them)."""
    (m0, up0), (m, up) = zero0_run, _two_steps_and_refresh(tiny_model_dir, stage)
    for a, b in zip(m0, m):
        assert b["train/loss"] == pytest.approx(a["train/loss"], abs=1e-6)
    assert m[1]["train/kl"] > 1e-4 and m[2]["train/kl"] == pytest.approx(0.0, abs=1e-9)
    assert up.version == up0.version == 3 and set(up.tensors) == set(up0.tensors)
    for k in up0.tensors:
        torch.testing.assert_close(up.tensors[k], up0.tensors[k], rtol=0, atol=1e-5)


def test_softmax_weighted_metrics_reach_the_logs(tiny_model_dir):
    """Every metric the loss returns reaches train/*: softmax_weighted's seq_logp_mean, weight_min
    and weight_max (dropped by a fixed key list before), over 4 micro-batches, equal to
    weighted_nll_loss on the whole batch (min / max over micro-batches, seq_logp_mean over rows)."""
    from grpo_dist.algo import weighted_nll_loss

    learner, _ = make_learner(make_cfg(tiny_model_dir, algo=dict(preset="softmax_weighted")))
    randomize_lora(learner, seed=2)
    rng = torch.Generator().manual_seed(0)
    batch = make_batch(8, seed=14, advantages=torch.rand(8, generator=rng).tolist())
    t = loss_inputs(learner, batch)
    _, want = weighted_nll_loss(t["logp"], t["advantages"], t["mask"])
    m = learner.train_step(batch)
    for k in ("seq_logp_mean", "weight_min", "weight_max", "nll_token_mean"):
        assert m[f"train/{k}"] == pytest.approx(want[k], abs=1e-5, rel=1e-5), k
    assert m["train/weight_min"] == pytest.approx(min(batch.advantages)) and \
        m["train/weight_max"] == pytest.approx(max(batch.advantages))


def test_metric_accumulator_reduces_any_name_by_its_suffix():
    from grpo_dist.learner.state import MetricAccumulator

    acc = MetricAccumulator()
    acc.add({"loss": 0.5, "new_max": 1.0, "new_min": 3.0, "new_thing": 1.0, "seq_x_mean": 2.0}, tokens=1, seqs=3)
    acc.add({"loss": 0.25, "new_max": 2.0, "new_min": -1.0, "new_thing": torch.tensor(4.0), "seq_x_mean": 6.0},
            tokens=3, seqs=1)
    out = acc.reduce(world_size=1)
    assert out == {"train/loss": 0.75, "train/new_max": 2.0, "train/new_min": -1.0, "train/new_thing": 3.25,
                   "train/seq_x_mean": 3.0}


def test_checkpoint_restores_the_rng_so_dropout_resumes_exactly(tiny_model_dir):
    """LoRA dropout 0.1 draws from torch's RNG in every training forward: a learner restored from
    a checkpoint's files trains the next step exactly as the one that wrote them (before the RNG
    was saved, its dropout masks came from the set-up seed instead)."""
    cfg = make_cfg(tiny_model_dir, lora=dict(dropout=0.1))
    a, _ = make_learner(cfg)
    batch = make_batch(8, seed=41)
    for _ in range(2):
        a.train_step(batch)
    files = a.checkpoint_files({"step": 2})
    assert "learner_rng/rank0.pt" in files
    ma, up_a = a.train_step(batch), a.export_update()

    b, _ = make_learner(cfg)
    assert b.load_checkpoint_files(files) == {"step": 2}
    mb, up_b = b.train_step(batch), b.export_update()
    assert mb["train/loss"] == ma["train/loss"] and mb["train/grad_norm"] == ma["train/grad_norm"]
    for k in up_a.tensors:
        assert torch.equal(up_a.tensors[k], up_b.tensors[k]), k
    # the check can fail: another dropout draw gives another gradient
    c, _ = make_learner(cfg)
    c.load_checkpoint_files({k: v for k, v in files.items() if not k.startswith("learner_rng/")})
    assert c.train_step(batch)["train/grad_norm"] != ma["train/grad_norm"]


def test_perf_metrics_count_the_step_flops(fresh):
    """perf/learner_tflops x the step's time = 4 N T (LoRA update) + 2 N T (the reference pass)
    with N the non-embedding parameters and T the tokens run (every prompt here is its own);
    perf/mfu divides by the GEMM roof measured at set-up."""
    from grpo_dist.learner import perf

    learner, info, _ = fresh
    batch = make_batch(8, seed=15)
    m = learner.train_step(batch)
    tokens = sum(len(p) + len(c) for p, c in zip(batch.prompt_ids, batch.completion_ids))
    params = perf.non_embedding_params(learner.engine.module)
    assert 0 < params < info["total_params"]
    flops = m["perf/learner_tflops"] * 1e12 * m["timing/learn_total"]
    assert flops == pytest.approx(6 * params * tokens, rel=1e-9)
    assert m["perf/mfu"] == pytest.approx(m["perf/learner_tflops"] / info["peak_tflops"], rel=1e-9)
    assert info["peak_tflops"] > 0 and info["peak_source"].startswith("CPU: measured float32 GEMM roof")


def test_peak_table_and_cpu_roof():
    from grpo_dist.learner import perf

    names = {"NVIDIA H100 80GB HBM3": 989.4, "NVIDIA H100 PCIe": 756.0, "NVIDIA H200": 989.4,
             "NVIDIA A100-SXM4-80GB": 312.0, "NVIDIA A10G": 70.0, "NVIDIA A10": 125.0, "NVIDIA L40S": 362.1,
             "NVIDIA L4": 121.0, "Some Future GPU": None}
    assert {n: perf.gpu_peak_tflops(n) for n in names} == names
    roof = perf.matmul_roof(torch.float32)
    assert roof > 1e9 and perf.matmul_roof(torch.float32) == roof  # measured once per process


@pytest.mark.parametrize("lora_dtype", ["float32", "model"])
def test_a_bf16_base_trains_its_adapter_in_the_dtype_lora_dtype_names(tiny_model_dir, lora_dtype):
    """``lora.dtype: float32`` (the default): on a bf16 base the adapter's weights, gradients and Adam
    state are float32 and DeepSpeed runs its plain fp32 path (the frozen base stays bf16); ``model``:
    DeepSpeed's bf16 mode (bf16 weights in the forward, fp32 master copies, bf16 gradient accumulation).
    Both train, and take the same first step up to bf16 rounding."""
    cfg = make_cfg(tiny_model_dir, lora=dict(dtype=lora_dtype))
    cfg.model.dtype = "bfloat16"
    learner, _ = make_learner(cfg)
    module = learner.policy.module
    trainable = {q.dtype for q in module.parameters() if q.requires_grad}
    frozen = {q.dtype for q in module.parameters() if not q.requires_grad}
    wrapper = type(learner.engine.optimizer).__name__
    assert frozen == {torch.bfloat16}
    if lora_dtype == "float32":
        assert trainable == {torch.float32} and wrapper != "FP16_UnfusedOptimizer", (trainable, wrapper)
    else:
        assert trainable == {torch.bfloat16} and wrapper == "FP16_UnfusedOptimizer", (trainable, wrapper)
    m = learner.train_step(make_batch(8, seed=1, advantages=[2.0] * 8))
    assert m["train/loss"] == pytest.approx(-2.0, abs=1e-6) and m["train/grad_norm"] > 0
    up = learner.export_update()
    assert any(float(t.float().abs().max()) > 0 for k, t in up.tensors.items() if "lora_B" in k)
    assert {t.dtype for t in up.tensors.values()} == trainable
