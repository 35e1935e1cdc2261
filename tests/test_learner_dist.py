"""Two learner ranks (two processes, gloo) == one process on the whole batch.

Compared: the reduced gradient (before clipping / Adam, where a wrong global scale would show),
the loss and KL, the exported adapter after one update, and the gradient of a second step.
"""

from __future__ import annotations


import pytest
import torch

from grpo_dist.util.ports import free_port
from grpo_dist.testing.learner import random_batch, small_config, two_step_grads, two_step_rank, zero3_rank


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.parametrize("algo", [{}, {"top_entropy_frac": 0.4}], ids=["all_tokens", "top_entropy_0.4"])
def test_two_ranks_match_single_process(tiny_model_dir, tmp_path, algo):
    """With top_entropy_frac the token selection is global (one threshold for the whole batch),
    so the 2-rank gradient still equals the single-process one."""
    import torch.multiprocessing as mp

    from grpo_dist.learner import Learner

    batch, batch2 = random_batch(8, seed=21), random_batch(8, seed=22)
    mp.spawn(two_step_rank, args=(2, free_port(), str(tiny_model_dir), str(tmp_path), batch, batch2, algo),
             nprocs=2, join=True)
    r0, r1 = (torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in range(2))

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        learner = Learner(small_config(tiny_model_dir, algo=dict(beta=0.04, **algo)), master_port=free_port())
        learner.setup()
        single = two_step_grads(learner, batch, batch2)
        learner.shutdown()
    finally:
        torch.set_num_threads(n)

    assert r1["tensors"] is None and r0["version"] == r1["version"] == single["version"] == 2
    for key in ("m1", "m2"):
        names = ["train/loss", "train/loss_kl", "train/kl", "train/grad_norm", "train/tokens", "train/entropy",
                 "train/ratio_mean"] + (["train/entropy_selected_frac"] if algo else [])
        if algo:
            assert 0.3 < single[key]["train/entropy_selected_frac"] < 0.6
        for name in names:
            assert r0[key][name] == pytest.approx(single[key][name], rel=1e-5, abs=1e-7), (key, name)
            assert r1[key][name] == pytest.approx(r0[key][name], rel=1e-6, abs=1e-8), (key, name)
    for g in ("grads1", "grads2"):
        assert set(r0[g]) == set(single[g])
        for k in single[g]:
            assert float(single[g][k].abs().max()) > 0, k
            torch.testing.assert_close(r0[g][k], single[g][k], rtol=1e-5, atol=1e-7)
            torch.testing.assert_close(r1[g][k], r0[g][k], rtol=0, atol=0)  # identical after all-reduce
    for k, v in single["tensors"].items():
        torch.testing.assert_close(r0["tensors"][k], v, rtol=0, atol=1e-6)


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_two_ranks_on_a_bf16_base_reduce_float32_adapter_gradients(tiny_model_dir, tmp_path):
    """``lora.dtype: float32`` on a bf16 base over two ranks: DeepSpeed's fp32 path all-reduces the
    adapter's float32 gradients (identical on both ranks) and the ranks end with the same adapter,
    which matches one process's up to bf16 rounding of the base's activations."""
    import torch.multiprocessing as mp

    from grpo_dist.learner import Learner

    batch, batch2 = random_batch(8, seed=21), random_batch(8, seed=22)
    mp.spawn(two_step_rank, args=(2, free_port(), str(tiny_model_dir), str(tmp_path), batch, batch2, {}, "bfloat16"),
             nprocs=2, join=True)
    r0, r1 = (torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in range(2))
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        cfg = small_config(tiny_model_dir, algo=dict(beta=0.04))
        cfg.model.dtype = "bfloat16"
        learner = Learner(cfg, master_port=free_port())
        learner.setup()
        single = two_step_grads(learner, batch, batch2)
        learner.shutdown()
    finally:
        torch.set_num_threads(n)
    for g in ("grads1", "grads2"):
        for k, v in r0[g].items():
            assert v.dtype == torch.float32 and float(v.abs().max()) > 0, k
            torch.testing.assert_close(r1[g][k], v, rtol=0, atol=0)  # identical after all-reduce
            rel = float((v - single[g][k]).norm() / single[g][k].norm())
            assert rel < 0.05, (g, k, rel)  # bf16 activations: ~1% here
    assert {t.dtype for t in r0["tensors"].values()} == {torch.float32}
    for key in ("m1", "m2"):
        assert r0[key]["train/loss"] == pytest.approx(single[key]["train/loss"], rel=0.02, abs=1e-3)


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_zero3_two_ranks_train_refresh_and_export_like_one_process(tiny_model_dir, tmp_path):
    """Parameters partitioned over 2 ranks: the same loss and exported adapter as one ZeRO-0
    process, and a mix-1 reference refresh (which gathers the partitioned LoRA weights) gives
    KL 0 on the next step."""
    import torch.multiprocessing as mp

    from grpo_dist.learner import Learner

    batch = random_batch(8, seed=23)
    mp.spawn(zero3_rank, args=(2, free_port(), str(tiny_model_dir), str(tmp_path), batch), nprocs=2, join=True)
    r0, r1 = (torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in range(2))

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        learner = Learner(small_config(tiny_model_dir, algo=dict(beta=0.04, ref_refresh_every=1)),
                          master_port=free_port())
        learner.setup()
        m = learner.train_step(batch)
        learner.refresh_reference(1.0)
        m2 = learner.train_step(batch)
        single = learner.export_update().tensors
        learner.shutdown()
    finally:
        torch.set_num_threads(n)

    assert r1["tensors"] is None and set(r0["tensors"]) == set(single)
    assert r0["m"]["train/loss"] == pytest.approx(m["train/loss"], rel=1e-5, abs=1e-7)
    assert r0["m2"]["train/kl"] == pytest.approx(0.0, abs=1e-9) and m2["train/kl"] == pytest.approx(0.0, abs=1e-9)
    assert r0["m2"]["train/loss"] == pytest.approx(m2["train/loss"], rel=1e-5, abs=1e-7)
    for k, v in single.items():
        torch.testing.assert_close(r0["tensors"][k], v, rtol=0, atol=1e-5)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_two_zero2_ranks_with_a_token_budget_run_equal_micro_batch_counts(tiny_model_dir, tmp_path):
    """learner.micro_batch_tokens on 2 ZeRO-2 ranks whose shards are uneven and need different
    counts: 9 rows (two groups of 4 and an agent's earlier segment after them), rank 0's 4 rows
    short, rank 1's 5 long (one micro-batch each). Both run rank 1's count (ZeRO-2 reduces per
    backward: a rank with fewer would hang the other), rank 0 its 4 rows and an idle micro-batch
    (issue 42, B1: it raised "cannot split into 5 micro-batches of 4 sequences"); both steps equal
    the same ranks' count split and one ZeRO-2 process with the same budget on the whole batch.
    (Against ZeRO-2 only: ``randomize_lora`` sets the module's LoRA B, which ZeRO-2's float32
    master partition does not see, so its first update starts from B = 0.)"""
    import torch.multiprocessing as mp

    from grpo_dist.learner import Learner
    from grpo_dist.learner.batching import token_micro_batches

    def shaped(seed):
        b = random_batch(9, seed=seed)
        b.completion_ids = [c[:1] if i < 4 else c + [9] * (8 - len(c)) for i, c in enumerate(b.completion_ids)]
        return b

    batch, batch2 = shaped(21), shaped(22)
    budget = 16
    need = [len(token_micro_batches(batch.shard(r, 2), budget, packed=True)) for r in range(2)]
    assert need[0] < need[1] == 5 > len(batch.shard(0, 2)) == 4  # rank 0 is short of rows
    res = {}
    for name, learner in (("count", {"zero_stage": 2}), ("tokens", {"zero_stage": 2, "micro_batch_tokens": budget})):
        out = tmp_path / name
        out.mkdir()
        mp.spawn(two_step_rank, args=(2, free_port(), str(tiny_model_dir), str(out), batch, batch2, {}, "float32",
                                      learner), nprocs=2, join=True)
        res[name] = [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(2)]
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        one = Learner(small_config(tiny_model_dir, learner={"zero_stage": 2, "micro_batch_tokens": budget},
                                   algo=dict(beta=0.04)), master_port=free_port())
        one.setup()
        single = two_step_grads(one, batch, batch2)
        one.shutdown()
    finally:
        torch.set_num_threads(n)
    (c0, _), (t0, t1) = res["count"], res["tokens"]
    assert t0["m1"]["train/micro_batches"] == t1["m1"]["train/micro_batches"] == need[1]
    assert c0["m1"]["train/micro_batches"] == 2  # micro_batch_size 2: gradient accumulation 2 per rank
    for key in ("m1", "m2"):
        for name in ("train/loss", "train/kl", "train/grad_norm", "train/tokens", "train/sequences", "train/entropy"):
            for other in (c0, single):
                assert t0[key][name] == pytest.approx(other[key][name], rel=1e-5, abs=1e-7), (key, name)
    assert t0["m1"]["train/sequences"] == 9
    for g in ("grads1", "grads2"):
        for k in c0[g]:
            # float32 sums in other orders: ZeRO-2 reduces each backward's gradients over the ranks, so
            # 5 + 5 micro-batches, 2 + 2 and one process's 5 add them up differently (an idle micro-batch
            # adds exactly 0: test_micro_tokens.py, test_an_idle_micro_batch_adds_exactly_nothing)
            torch.testing.assert_close(t0[g][k], c0[g][k], rtol=1e-4, atol=1e-6)
            torch.testing.assert_close(t0[g][k], single[g][k], rtol=1e-4, atol=1e-6)
    for k, v in c0["tensors"].items():
        # lr 2e-3: Adam's first step moves a weight by lr * g / (|g| + 1e-8), about +-lr, but for a gradient
        # element within ~1e-6 of 0 by an amount its rounding changes (1e-5 seen); a wrong update is off by ~lr
        torch.testing.assert_close(t0["tensors"][k], v, rtol=0, atol=1e-4)
        torch.testing.assert_close(single["tensors"][k], v, rtol=0, atol=1e-4)
