"""Group packing (grpo_dist/learner/packing.py): one prompt per row with its completions after it.

The packed layout must give the padded layout's log-probs, entropies and gradients (to float
rounding) on the real tiny model through the DeepSpeed + PEFT learner, and the learner must fall
back to padding, saying why, when the model's attention ignores the 4-D mask.
"""

from __future__ import annotations

import random

import pytest
import torch

from grpo_dist.learner.packing import collate_packed, plan_rows
from grpo_dist.learner.testing import make_learner, randomize_lora, small_config, train_step_with_grads
from grpo_dist.types import TrainBatch

pytestmark = pytest.mark.usefixtures("in_process_learners")


def grouped_batch(prompts: int = 4, group: int = 4, seed: int = 0, max_comp: int = 9) -> TrainBatch:
    """``prompts`` groups of ``group`` ragged completions (1..max_comp tokens) of one prompt each."""
    rng = random.Random(seed)
    p_ids, c_ids = [], []
    for _ in range(prompts):
        p = [1] + [rng.randrange(4, 100) for _ in range(rng.randint(2, 6))]
        for _ in range(group):
            p_ids.append(p)
            c_ids.append([rng.randrange(4, 100) for _ in range(rng.randint(1, max_comp))])
    adv = [rng.gauss(0.0, 1.0) for _ in p_ids]
    return TrainBatch(prompt_ids=p_ids, completion_ids=c_ids, behaviour_logprobs=[], advantages=adv)


def test_plan_rows_shares_a_prompt_within_the_cap():
    a, b = (1, 2, 3), (1, 5)
    prompts = [a, a, a, b, b, a]
    lens = [4, 4, 4, 2, 2, 1]
    assert plan_rows(prompts, lens, max_len=11) == [(3, [0, 1]), (3, [2]), (2, [3, 4]), (3, [5])]
    assert plan_rows(prompts, lens, max_len=100) == [(3, [0, 1, 2]), (2, [3, 4]), (3, [5])]
    # a sequence longer than the cap still gets a row of its own
    assert plan_rows([a], [50], max_len=8) == [(3, [0])]


def test_collate_packed_layout():
    batch = TrainBatch(prompt_ids=[[1, 7, 8]] * 3, completion_ids=[[20, 21, 22, 23], [30, 31], [40, 41, 42]],
                       behaviour_logprobs=[], advantages=[1.0, -1.0, 0.0])
    mb = collate_packed(batch, pad_id=0, max_len=64)
    assert mb.packed and mb.input_ids.tolist() == [[1, 7, 8, 20, 21, 22, 23, 30, 31, 40, 41, 42]]
    assert mb.position_ids.tolist() == [[0, 1, 2, 3, 4, 5, 6, 3, 4, 3, 4, 5]]
    assert mb.row.tolist() == [0, 0, 0] and mb.first_pos.tolist() == [2, 2, 2] and mb.first_tok.tolist() == [20, 30, 40]
    # token j >= 1 of a completion is predicted by the window column just before it
    assert mb.index[0, 1:4].tolist() == [3, 4, 5] and mb.index[1, 1].tolist() == 7 and mb.index[2, 1:3].tolist() == [9, 10]
    sees = (mb.attention_mask[0, 0] == 0)
    assert sees[7].tolist() == [True] * 3 + [False] * 4 + [True] + [False] * 4  # 30: prompt + itself
    assert sees[11].tolist() == [True] * 3 + [False] * 6 + [True] * 3  # 42: prompt + 40, 41, itself
    assert sees[2].tolist() == [True] * 3 + [False] * 9  # the prompt sees no completion
    assert mb.valid.sum().item() == 9 and mb.mask.shape == (3, 4)

    # two rows (cap), padding at the end of the shorter sees only itself
    mb2 = collate_packed(batch, pad_id=0, max_len=9)
    assert mb2.input_ids.shape == (2, 9) and mb2.row.tolist() == [0, 0, 1]
    assert mb2.input_ids[1].tolist() == [1, 7, 8, 40, 41, 42, 0, 0, 0] and mb2.index[2, 1:3].tolist() == [3, 4]
    assert (mb2.attention_mask[1, 0, 7] == 0).tolist() == [False] * 7 + [True, False]


@pytest.fixture(scope="module")
def twin(tiny_model_dir):
    """One learner (LoRA B randomised: policy != reference) with packing on."""
    learner, info = make_learner(small_config(tiny_model_dir, algo=dict(beta=0.04),
                                              learner={"micro_batch_size": 16}))
    randomize_lora(learner, seed=3)
    return learner, info


@pytest.mark.parametrize("cap", [None, 12])
def test_packed_logprobs_and_entropy_equal_padded(twin, cap):
    learner, info = twin
    assert info["packed_row_len"] > 0 and learner.packing_line.startswith("learner: group packing on")
    batch = grouped_batch(4, 4, seed=1)
    length = learner._pack_len
    try:
        learner._pack_len = cap or length  # cap 12: a group's completions spread over several rows
        packed = learner._collate(batch, packed=True)
        if cap:
            assert packed.input_ids.shape[0] > 4
        else:
            assert packed.input_ids.shape[0] == 4
        padded = learner._collate(batch, packed=False)
        with learner._eval_mode(), torch.no_grad():
            lp_pack, ent_pack = learner._forward(packed, learner.engine.module, entropy=True)
            lp_pad, ent_pad = learner._forward(padded, learner.engine.module, entropy=True)
            ref_pack = learner._logprobs_nograd(packed, reference=True)
            ref_pad = learner._logprobs_nograd(padded, reference=True)
    finally:
        learner._pack_len = length
    assert lp_pack.shape == lp_pad.shape
    assert torch.allclose(lp_pack, lp_pad, atol=2e-5), float((lp_pack - lp_pad).abs().max())
    assert torch.allclose(ent_pack, ent_pad, atol=2e-5)
    assert torch.allclose(ref_pack, ref_pad, atol=2e-5)
    assert float((ref_pad - lp_pad).abs().max()) > 1e-3  # the two passes differ: the check means something
    assert float(packed.input_ids.numel()) < float(padded.input_ids.numel())


def test_packed_gradients_and_step_equal_padded(tiny_model_dir):
    batch = grouped_batch(4, 4, seed=2)
    grads, metrics = {}, {}
    for mode in ("auto", "off"):
        learner, info = make_learner(small_config(tiny_model_dir, algo=dict(beta=0.04),
                                                  learner={"micro_batch_size": 8, "packing": mode}))
        assert (info["packed_row_len"] > 0) == (mode == "auto")
        randomize_lora(learner, seed=5)
        grads[mode], metrics[mode] = train_step_with_grads(learner, batch)
        learner.shutdown()
    assert grads["auto"].keys() == grads["off"].keys() and grads["auto"]
    scale = max(float(g.abs().max()) for g in grads["off"].values())
    worst = max(float((grads["auto"][k] - grads["off"][k]).abs().max()) for k in grads["off"])
    assert scale > 1e-4 and worst < 1e-4 * scale, (worst, scale)
    for key in ("train/loss", "train/kl", "train/entropy"):
        assert metrics["auto"][key] == pytest.approx(metrics["off"][key], rel=1e-4, abs=1e-6)


def test_falls_back_to_padding_when_the_mask_is_ignored(tiny_model_dir, monkeypatch):
    """Fault injection: an attention that ignores the 4-D mask (as flash-attention does) is the
    same as a mask that lets every token see the whole row: the set-up check must refuse it."""
    import grpo_dist.learner.learner as learner_mod

    real = learner_mod.collate_packed

    def ignoring(*args, **kwargs):
        mb = real(*args, **kwargs)
        mb.attention_mask = torch.zeros_like(mb.attention_mask)
        return mb

    monkeypatch.setattr(learner_mod, "collate_packed", ignoring)
    learner, info = make_learner(small_config(tiny_model_dir))
    try:
        assert info["packed_row_len"] == 0
        assert learner.packing_line.startswith("learner: group packing off: the model's attention")
        assert "learner.packing: off" in learner.packing_line
        assert not learner._collate(grouped_batch(2, 2)).packed
        m = learner.train_step(grouped_batch(2, 4, seed=3))  # trains, padded
        assert m["train/tokens"] > 0
    finally:
        learner.shutdown()


def test_packing_off_skips_the_check(tiny_model_dir):
    learner, info = make_learner(small_config(tiny_model_dir, learner={"packing": "off"}))
    try:
        assert info["packed_row_len"] == 0 and learner.packing_line == "learner: packing off (learner.packing: off)"
    finally:
        learner.shutdown()
