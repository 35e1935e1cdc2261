"""Several LoRA adapters on one base in one learner rank (issue 53, item 3): each adapter's update
equals its single-run update bit for bit on the same batch, whatever the other adapters do in
between; the base is held once; the shared keys are checked."""

from __future__ import annotations

import pytest
import torch

from grpo_dist.learner import Learner
from grpo_dist.learner.adapters import check_shared
from grpo_dist.testing.learner import in_process_port, random_batch, small_config

pytestmark = [pytest.mark.usefixtures("in_process_learners"), pytest.mark.budget(240)]


def _cfgs(model_dir):
    a = small_config(model_dir, algo=dict(beta=0.04), learner=dict(lr=2e-3, grad_clip=0.5),
                     trainer=dict(seed=1))
    b = small_config(model_dir, algo=dict(beta=0.0, agg="token-mean"), learner=dict(lr=5e-3, warmup_steps=3),
                     lora=dict(r=4, alpha=8), trainer=dict(seed=2))
    return a, b


def _train(learner, batches, adapter=None) -> list[dict]:
    return [learner.train_step(b, adapter=adapter) for b in batches]


@pytest.fixture(scope="module")
def single_runs(tiny_model_dir):
    """Each adapter's config trained alone: two steps, then its exported tensors."""
    out = {}
    for name, cfg, seed in (("a", _cfgs(tiny_model_dir)[0], 1), ("b", _cfgs(tiny_model_dir)[1], 2)):
        learner = Learner(cfg, master_port=in_process_port())
        learner.setup()
        metrics = _train(learner, [random_batch(8, seed=seed), random_batch(8, seed=seed + 10)])
        out[name] = (metrics, learner.export_update(), learner.version)
        learner.shutdown()
    return out


@pytest.fixture(scope="module")
def multi(tiny_model_dir):
    a, b = _cfgs(tiny_model_dir)
    learner = Learner(a, master_port=in_process_port(), adapters={"a": a, "b": b})
    info = learner.setup()
    yield learner, info
    learner.shutdown()


def test_each_adapters_update_equals_its_single_run_bit_for_bit(single_runs, multi):
    learner, _ = multi
    # interleaved: b's first step between a's two
    ma1 = learner.train_step(random_batch(8, seed=1), adapter="a")
    mb1 = learner.train_step(random_batch(8, seed=2), adapter="b")
    ma2 = learner.train_step(random_batch(8, seed=11), adapter="a")
    mb2 = learner.train_step(random_batch(8, seed=12), adapter="b")
    for name, got in (("a", [ma1, ma2]), ("b", [mb1, mb2])):
        metrics, update, version = single_runs[name]
        mine = learner.export_update(adapter=name)
        assert learner.version == version == 2
        assert mine.tensors.keys() == update.tensors.keys()
        for k, t in update.tensors.items():
            assert torch.equal(mine.tensors[k], t), (name, k)
        for m_single, m_multi in zip(metrics, got):
            for key in ("train/loss", "train/grad_norm", "train/lr", "train/kl"):
                assert m_multi.get(key) == m_single.get(key), (name, key)
    # the adapters differ from each other: own rank, own learning rate, own schedule
    ta, tb = learner.export_update(adapter="a").tensors, learner.export_update(adapter="b").tensors
    k = next(k for k in ta if "lora_A" in k)
    assert ta[k].shape[0] == 8 and tb[k].shape[0] == 4
    assert ma1["train/lr"] == pytest.approx(2e-3) and mb1["train/lr"] == pytest.approx(5e-3 / 3)


def test_the_base_is_held_once_and_each_adapter_trains_only_its_own(multi):
    learner, info = multi
    assert info["adapters"] == ["a", "b"]
    pa, pb = (learner._slots[n].policy for n in ("a", "b"))
    frozen_a = {p.data_ptr() for p in pa.module.parameters() if not p.requires_grad}
    frozen_b = {p.data_ptr() for p in pb.module.parameters() if not p.requires_grad}
    assert frozen_a == frozen_b and len(frozen_a) > 5  # the same tensors, not copies
    once = {p.data_ptr(): p.numel() * p.element_size() for p in pa.module.parameters() if not p.requires_grad}
    assert info["base_bytes"] == sum(once.values())  # counted once, not once per adapter
    own_a = {p.data_ptr() for p in pa.trainable()}
    own_b = {p.data_ptr() for p in pb.trainable()}
    assert own_a and own_b and not own_a & own_b
    before = {n: t.clone() for n, t in learner.export_update(adapter="b").tensors.items()}
    learner.train_step(random_batch(8, seed=5), adapter="a")
    after = learner.export_update(adapter="b").tensors
    assert all(torch.equal(before[n], after[n]) for n in before)  # a's step left b alone
    with pytest.raises(KeyError, match="no adapter 'c'"):
        learner.train_step(random_batch(8), adapter="c")


def test_keys_the_adapters_share_must_agree(tiny_model_dir):
    a, b = _cfgs(tiny_model_dir)
    check_shared({"a": a, "b": b})
    c = small_config(tiny_model_dir, learner=dict(gradient_checkpointing=True))
    with pytest.raises(ValueError, match=r"adapters\.c: learner\.gradient_checkpointing must equal"):
        check_shared({"a": a, "c": c})
    z3 = small_config(tiny_model_dir, learner=dict(zero_stage=3))
    with pytest.raises(ValueError, match="zero_stage 3"):
        check_shared({"a": z3, "b": z3})


@pytest.mark.slow
@pytest.mark.budget(180)
def test_zero2_two_ranks_train_an_adapter_beside_another_as_alone(tiny_model_dir, tmp_path):
    """Two ZeRO-2 ranks: adapter a's weights after two steps are the same bits whether the learner
    holds a alone or a and b (b trained before each of a's steps, with its own optimizer partitions)."""
    import torch.multiprocessing as mp

    from grpo_dist.testing.learner import adapters_rank
    from grpo_dist.util.ports import free_port

    batches = [random_batch(8, seed=21), random_batch(8, seed=22)]
    out = {}
    for beside in (False, True):
        d = tmp_path / str(beside)
        d.mkdir()
        mp.spawn(adapters_rank, args=(2, free_port(), str(tiny_model_dir), str(d), batches, beside), nprocs=2,
                 join=True)
        out[beside] = torch.load(d / "rank0.pt")
    alone, beside = out[False], out[True]
    assert alone["version"] == beside["version"] == 2
    assert alone["tensors"].keys() == beside["tensors"].keys()
    assert any(float(t.abs().max()) > 0 for k, t in alone["tensors"].items() if "lora_B" in k)  # it trained
    for k, t in alone["tensors"].items():
        assert torch.equal(beside["tensors"][k], t), k
