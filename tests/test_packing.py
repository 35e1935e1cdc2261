"""Group packing (grpo_dist/learner/packing.py): each prompt once with its completions after it.

Both packed layouts -- ``group`` (one row, group attention: grpo_dist/learner/group_attention.py)
and ``mask`` (a row per prompt group, 4-D mask) -- must give the padded layout's log-probs,
entropies and gradients (to float rounding) on the real tiny model (grouped-query attention: 4
heads, 2 key/value heads) through the DeepSpeed + PEFT learner, and the learner must fall back,
saying why, when a layout does not reproduce the padded one.
"""

from __future__ import annotations

import random

import pytest
import torch

from grpo_dist.learner.packing import collate_packed, plan_rows
from grpo_dist.testing.learner import make_learner, randomize_lora, small_config, train_step_with_grads
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
    assert mb.packed and mb.groups is None and mb.input_ids.tolist() == [[1, 7, 8, 20, 21, 22, 23, 30, 31, 40, 41, 42]]
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


def test_collate_group_layout_one_row_and_blocks():
    """Two prompt groups in one row, no padding; each completion's keys are its prompt's positions
    then its own, causal on its own part."""
    batch = TrainBatch(prompt_ids=[[1, 7, 8]] * 2 + [[1, 9]] * 2, completion_ids=[[20, 21], [30], [40, 41, 42], [50]],
                       behaviour_logprobs=[], advantages=[0.0] * 4)
    mb = collate_packed(batch, pad_id=0, group=True)
    assert mb.input_ids.tolist() == [[1, 7, 8, 20, 21, 30, 1, 9, 40, 41, 42, 50]]
    assert mb.position_ids.tolist() == [[0, 1, 2, 3, 4, 3, 0, 1, 2, 3, 4, 2]]
    assert mb.first_pos.tolist() == [2, 2, 7, 7] and mb.index[2, 1:3].tolist() == [8, 9]
    assert mb.attention_mask.shape == (1, 1, 1, 1)  # a placeholder: group attention reads the layout
    g = mb.groups
    assert g.prompt_q.tolist() == [[0, 1, 2], [6, 7, 0]] and g.prompt_dst.tolist() == [0, 1, 2, 6, 7]
    assert g.comp_q.tolist() == [[3, 4, 0], [5, 0, 0], [8, 9, 10], [11, 0, 0]]
    assert g.comp_k[2].tolist() == [6, 7, 0, 8, 9, 10] and g.comp_dst.tolist() == [3, 4, 5, 8, 9, 10, 11]
    assert g.comp_mask[2, 0, 1].tolist() == [True, True, False, True, True, False]  # 41: prompt of 2, 40, itself
    assert g.comp_mask[0, 0, 0].tolist() == [True, True, True, True, False, False]  # 20: prompt, itself
    assert g.prompt_mask[1, 0].tolist() == [[True, False, False], [True, True, False], [True, True, False]]


@pytest.mark.parametrize("dtype,window", [(torch.float32, None), (torch.bfloat16, None), (torch.float32, 3)])
def test_group_attention_equals_masked_attention(dtype, window):
    """The blockwise attention equals one softmax attention over the row with the mask that says
    who sees whom (and, with a sliding window, only keys less than ``window`` positions back),
    outputs and gradients, with grouped-query heads (4 query, 2 key/value)."""
    from grpo_dist.learner.group_attention import group_attention

    batch = grouped_batch(3, 4, seed=7)
    mb = collate_packed(batch, pad_id=0, group=True)
    T, H, D = mb.input_ids.shape[1], 4, 16
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, h, T, D, generator=g).to(dtype).requires_grad_() for h in (H, 2, 2))
    # who sees whom: the prompt itself causally; a completion its prompt and its own earlier tokens
    seg_of, prompt_of = torch.full((T,), -1), torch.full((T,), -1)
    for p, pos in enumerate(mb.groups.prompt_q.tolist()):
        for t in pos[:len(batch.prompt_ids[4 * p])]:
            seg_of[t], prompt_of[t] = 1000 + p, p
    for b, pos in enumerate(mb.groups.comp_q.tolist()):
        for t in pos[:len(batch.completion_ids[b])]:
            seg_of[t], prompt_of[t] = b, b // 4
    pos = torch.arange(T)
    sees = (pos[None, :] <= pos[:, None]) & ((seg_of[None, :] == seg_of[:, None])
                                              | ((seg_of[None, :] >= 1000) & (prompt_of[None, :] == prompt_of[:, None])))
    module = torch.nn.Module()
    if window:
        module.sliding_window = window
        p_ids = mb.position_ids[0]
        sees &= (p_ids[:, None] - p_ids[None, :]) < window
    ref = torch.nn.functional.scaled_dot_product_attention(
        q.float(), k.float().repeat_interleave(2, 1), v.float().repeat_interleave(2, 1), attn_mask=sees)
    out = group_attention(module, q, k, v, mb.groups)  # [1, T, H, D]
    tol = 1e-5 if dtype == torch.float32 else 3e-2
    assert torch.allclose(out.float(), ref.transpose(1, 2), atol=tol), float((out.float() - ref.transpose(1, 2)).abs().max())
    w = torch.randn(out.shape, generator=g)
    gq, gk, gv = torch.autograd.grad((out.float() * w).sum(), (q, k, v))
    rq, rk, rv = torch.autograd.grad((ref.transpose(1, 2) * w).sum(), (q, k, v))
    for a, b in ((gq, rq), (gk, rk), (gv, rv)):
        assert torch.isfinite(a).all()  # padding rows a window leaves empty must not poison the gradients
        assert torch.allclose(a.float(), b.float(), atol=10 * tol), float((a.float() - b.float()).abs().max())


def test_group_attention_refuses_what_it_does_not_compute():
    from grpo_dist.learner.group_attention import group_attention

    mb = collate_packed(grouped_batch(1, 2), pad_id=0, group=True)
    x = torch.zeros(1, 2, mb.input_ids.shape[1], 8)
    for attr in ("attn_logit_softcapping", "sinks"):
        module = torch.nn.Module()
        setattr(module, attr, 30.0)
        with pytest.raises(NotImplementedError, match=attr):
            group_attention(module, x, x, x, mb.groups)


def test_sliding_window_model_packs_with_its_window(tmp_path):
    """A Mistral-style model whose sliding window (4) is shorter than its sequences: the learner
    takes the group layout and its log-probs are the padded layout's, where transformers applies
    the window through its own masks (without the window they would differ: checked too)."""
    from transformers import MistralConfig, MistralForCausalLM

    torch.manual_seed(0)
    cfg = MistralConfig(vocab_size=101, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, head_dim=16, sliding_window=4,
                        max_position_embeddings=128, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    MistralForCausalLM(cfg).save_pretrained(tmp_path / "mistral")
    learner, info = make_learner(small_config(tmp_path / "mistral", algo=dict(beta=0.04),
                                              learner={"micro_batch_size": 16}))
    try:
        assert info["packing"] == "group", learner.layout.line
        randomize_lora(learner, seed=1)
        batch = grouped_batch(4, 4, seed=5)
        packed, padded = learner.layout.collate(batch), learner.layout.collate(batch, mode="off")
        lp_pack = learner.policy.logprobs_nograd(packed)
        lp_pad = learner.policy.logprobs_nograd(padded)
        learner.engine.module.config.sliding_window = None  # Mistral passes it from the config
        lp_nowindow = learner.policy.logprobs_nograd(packed)
        assert torch.allclose(lp_pack, lp_pad, atol=2e-5), float((lp_pack - lp_pad).abs().max())
        assert float((lp_nowindow - lp_pad).abs().max()) > 1e-3
    finally:
        learner.shutdown()


@pytest.fixture(scope="module")
def twin(tiny_model_dir):
    """One learner (LoRA B randomised: policy != reference) with packing on (auto = group)."""
    learner, info = make_learner(small_config(tiny_model_dir, algo=dict(beta=0.04),
                                              learner={"micro_batch_size": 16}))
    randomize_lora(learner, seed=3)
    return learner, info


@pytest.mark.parametrize("layout,cap", [("group", None), ("mask", None), ("mask", 12)])
def test_packed_logprobs_and_entropy_equal_padded(twin, layout, cap):
    learner, info = twin
    assert info["packing"] == "group" and learner.layout.line.startswith("learner: group packing on (one row")
    batch = grouped_batch(4, 4, seed=1)
    # cap 12: a group's completions spread over several rows
    packed = learner.layout.collate(batch, mode=layout, pack_len=cap or 512)
    rows = packed.input_ids.shape[0]
    assert rows == (1 if layout == "group" else 4 if cap is None else rows) and (cap is None or rows > 4)
    padded = learner.layout.collate(batch, mode="off")
    policy = learner.policy
    lp_pack, ent_pack = policy.logprobs_nograd(packed, entropy=True)
    lp_pad, ent_pad = policy.logprobs_nograd(padded, entropy=True)
    ref_pack = policy.logprobs_nograd(packed, reference=True)
    ref_pad = policy.logprobs_nograd(padded, reference=True)
    assert lp_pack.shape == lp_pad.shape
    assert torch.allclose(lp_pack, lp_pad, atol=2e-5), float((lp_pack - lp_pad).abs().max())
    assert torch.allclose(ent_pack, ent_pad, atol=2e-5)
    assert torch.allclose(ref_pack, ref_pad, atol=2e-5)
    assert float((ref_pad - lp_pad).abs().max()) > 1e-3  # the two passes differ: the check means something
    assert float(packed.input_ids.numel()) < float(padded.input_ids.numel())


def test_packed_gradients_and_step_equal_padded(tiny_model_dir):
    batch = grouped_batch(4, 4, seed=2)
    grads, metrics = {}, {}
    for mode in ("group", "mask", "off"):
        learner, info = make_learner(small_config(tiny_model_dir, algo=dict(beta=0.04),
                                                  learner={"micro_batch_size": 8, "packing": mode}))
        assert info["packing"] == mode and (info["packed_row_len"] > 0) == (mode == "mask")
        randomize_lora(learner, seed=5)
        grads[mode], metrics[mode] = train_step_with_grads(learner, batch)
        learner.shutdown()
    scale = max(float(g.abs().max()) for g in grads["off"].values())
    assert scale > 1e-4
    for mode in ("group", "mask"):
        assert grads[mode].keys() == grads["off"].keys() and grads[mode]
        worst = max(float((grads[mode][k] - grads["off"][k]).abs().max()) for k in grads["off"])
        assert worst < 1e-4 * scale, (mode, worst, scale)
        for key in ("train/loss", "train/kl", "train/entropy"):
            assert metrics[mode][key] == pytest.approx(metrics["off"][key], rel=1e-4, abs=1e-6)


def test_full_weights_reference_copy_gets_group_attention(tiny_model_dir):
    """Full fine-tuning keeps a frozen copy of the model as the KL reference: it must be switched
    to group attention too, or it would read the packed row through the placeholder mask."""
    learner, info = make_learner(small_config(tiny_model_dir, algo=dict(beta=0.04), lora={"enabled": False},
                                              learner={"micro_batch_size": 8}))
    try:
        assert info["packing"] == "group" and learner.reference.model is not None
        batch = grouped_batch(2, 4, seed=4)
        ref_pack = learner.policy.logprobs_nograd(learner.layout.collate(batch), reference=True)
        ref_pad = learner.policy.logprobs_nograd(learner.layout.collate(batch, mode="off"), reference=True)
        assert torch.allclose(ref_pack, ref_pad, atol=2e-5), float((ref_pack - ref_pad).abs().max())
    finally:
        learner.shutdown()


def test_falls_back_to_padding_when_no_layout_reproduces_padded(tiny_model_dir, monkeypatch):
    """Fault injection: a model whose attention ignores both the 4-D mask (as flash-attention does)
    and the group layout lets every token see the whole row: the set-up check must refuse both
    layouts, say why for each, and train padded."""
    import grpo_dist.learner.layout as layout_mod

    real = layout_mod.collate_packed

    def ignoring(*args, **kwargs):
        mb = real(*args, **kwargs)
        mb.groups = None
        mb.attention_mask = torch.zeros((mb.input_ids.shape[0], 1) + (mb.input_ids.shape[1],) * 2)
        return mb

    monkeypatch.setattr(layout_mod, "collate_packed", ignoring)
    learner, info = make_learner(small_config(tiny_model_dir))
    try:
        assert info["packing"] == "off" and info["packed_row_len"] == 0
        line = learner.layout.line
        assert line.startswith("learner: group packing off: the model's attention (sdpa)"), line
        assert "group: max |logp packed - padded|" in line and "; mask: max |logp" in line
        assert "learner.packing: off" in line
        assert learner.engine.module.config._attn_implementation == "sdpa"  # the wrapper was taken off
        assert not learner.layout.collate(grouped_batch(2, 2)).packed
        m = learner.train_step(grouped_batch(2, 4, seed=3))  # trains, padded
        assert m["train/tokens"] > 0
    finally:
        learner.shutdown()


def test_group_refused_falls_back_to_mask(tiny_model_dir, monkeypatch):
    """auto: group attention failing the check (here: it raises) leaves the 4-D mask layout."""
    import grpo_dist.learner.group_attention as ga

    def broken(*args, **kwargs):
        raise NotImplementedError("injected")

    monkeypatch.setattr(ga, "group_attention", broken)
    learner, info = make_learner(small_config(tiny_model_dir))
    try:
        assert info["packing"] == "mask" and info["packed_row_len"] > 0
        assert learner.layout.line.startswith("learner: group packing on (a row per prompt group")
        assert learner.engine.module.config._attn_implementation == "sdpa"
    finally:
        learner.shutdown()


def test_packing_off_skips_the_check(tiny_model_dir):
    learner, info = make_learner(small_config(tiny_model_dir, learner={"packing": "off"}))
    try:
        assert info["packing"] == "off" and info["packed_row_len"] == 0
        assert learner.layout.line == "learner: packing off (learner.packing: off)"
    finally:
        learner.shutdown()
