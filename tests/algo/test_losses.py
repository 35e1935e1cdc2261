import math

import pytest
import torch

from grpo_dist.algo import (
    AGG_MODES,
    aggregate,
    group_advantages,
    grpo_loss,
    policy_loss,
    selective_log_softmax,
    softmax_weights,
    weighted_nll_loss,
)

D = torch.float64


def rand_logps(b=4, t=6, seed=0, spread=0.3):
    g = torch.Generator().manual_seed(seed)
    ref = -torch.rand(b, t, generator=g, dtype=D) * 3 - 0.1
    logp = ref + torch.randn(b, t, generator=g, dtype=D) * spread
    old = ref + torch.randn(b, t, generator=g, dtype=D) * spread
    adv = torch.randn(b, generator=g, dtype=D)
    return logp, old, ref, adv


def ragged_mask(lengths, t):
    return (torch.arange(t)[None, :] < torch.tensor(lengths)[:, None]).to(D)


# ---------------------------------------------------------------- seed 000 (GRPO 101)

def seed000_plain(tlp, rlp, mask, advantage):  # verbatim from "The Basic GRPO Loss" (after log-probs)
    ratio = torch.exp(tlp - rlp)
    policy_loss = ratio * advantage
    per_token_loss = -policy_loss
    loss = (per_token_loss * mask).sum() / mask.sum()
    return loss


def seed000_clip(tlp, rlp, mask, advantage, epsilon=0.2):
    ratio = torch.exp(tlp - rlp)
    unclipped = ratio * advantage
    clipped = torch.clamp(ratio, 1 - epsilon, 1 + epsilon) * advantage
    policy_loss = torch.min(unclipped, clipped)
    per_token_loss = -policy_loss
    loss = (per_token_loss * mask).sum() / mask.sum()
    return loss


def seed000_kl(tlp, rlp, mask, advantage, epsilon=0.2, beta=0.1):
    ratio = torch.exp(tlp - rlp)
    unclipped = ratio * advantage
    clipped = torch.clamp(ratio, 1 - epsilon, 1 + epsilon) * advantage
    policy_loss = torch.min(unclipped, clipped)
    delta = tlp - rlp
    per_token_kl = torch.exp(-delta) + delta - 1
    per_token_loss = -(policy_loss - beta * per_token_kl)
    loss = (per_token_loss * mask).sum() / mask.sum()
    return loss


FORMS = {
    "plain": (seed000_plain, dict(clip_low=None, clip_high=None, beta=0.0)),
    "plain_huge_clip": (seed000_plain, dict(clip_low=1e9, clip_high=1e9, beta=0.0)),
    "clip": (seed000_clip, dict(clip_low=0.2, clip_high=0.2, beta=0.0)),
    "clip_kl": (seed000_kl, dict(clip_low=0.2, clip_high=0.2, beta=0.1, kl_kind="k3")),
}


@pytest.mark.parametrize("form", list(FORMS))
@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean"])
def test_seed000_step1_loss_is_minus_advantage(form, agg):
    # prompt (3 tokens) + completion "fence and" (2 tokens); policy == reference at step 1
    lp = torch.tensor([[-2.3, -0.7, -1.9, -4.1, -0.2]], dtype=D)
    mask = torch.tensor([[0, 0, 0, 1, 1]])
    loss, metrics = grpo_loss(lp, lp, lp, torch.tensor([2.0], dtype=D), mask, agg=agg, **FORMS[form][1])
    assert loss.item() == pytest.approx(-2.0, abs=1e-12)
    assert metrics["ratio_mean"] == 1.0 and metrics["clip_frac"] == 0.0


@pytest.mark.parametrize("form", list(FORMS))
def test_seed000_verbatim_on_random_logps(form):
    seed_fn, kw = FORMS[form]
    for seed in range(3):
        tlp, _, rlp, adv = rand_logps(3, 7, seed=seed, spread=0.5)
        mask = ragged_mask([7, 4, 2], 7)
        a = tlp.clone().requires_grad_(True)
        b = tlp.clone().requires_grad_(True)
        expected = seed_fn(a, rlp, mask, adv[:, None])  # one advantage per sequence
        ours, _ = grpo_loss(b, rlp, rlp, adv, mask, agg="token-mean", **kw)  # seed 000: ratio vs reference
        torch.testing.assert_close(ours, expected, rtol=1e-12, atol=1e-12)
        expected.backward()
        ours.backward()
        torch.testing.assert_close(b.grad, a.grad, rtol=1e-12, atol=1e-12)


# ---------------------------------------------------------------- seed 003

def seed003_compute_grpo_loss(old_logps, new_logps, advantages, epsilon, beta):  # verbatim
    log_ratio = new_logps - old_logps  # log(π_new / π_old)
    ratio = torch.exp(log_ratio)  # π_new / π_old
    unclipped = ratio * advantages
    clipped = torch.clamp(ratio, 1 - epsilon, 1 + epsilon) * advantages
    surrogate = torch.min(unclipped, clipped)
    pg_loss = -surrogate.mean()  # Negative sign to minimize loss
    kl_divergence = log_ratio.mean()
    kl_penalty = beta * kl_divergence
    return pg_loss + kl_penalty


def test_seed003_compute_grpo_loss_reproduced():
    g = torch.Generator().manual_seed(5)
    for _ in range(5):
        old = -torch.rand(8, generator=g, dtype=D) * 4
        new = old + torch.randn(8, generator=g, dtype=D) * 0.4
        adv = group_advantages(torch.randint(0, 2, (8,), generator=g).to(D), 4, std_unbiased=False, eps=1e-8)
        a = new.clone().requires_grad_(True)
        b = new.clone().requires_grad_(True)
        expected = seed003_compute_grpo_loss(old, a, adv, 0.2, 0.04)
        ours, m = grpo_loss(
            b[:, None], old[:, None], old[:, None], adv, torch.ones(8, 1),
            beta=0.04, clip_low=0.2, clip_high=0.2, kl_kind="k1", agg="token-mean",
        )
        torch.testing.assert_close(ours, expected, rtol=1e-12, atol=1e-12)
        expected.backward()
        ours.backward()
        torch.testing.assert_close(b.grad, a.grad, rtol=1e-12, atol=1e-12)
        assert m["kl_mean"] == pytest.approx(float((new - old).mean()))


def test_seed003_identical_policies_zero_mean_advantages():
    adv = group_advantages(torch.tensor([1.0, 1, 1, 1, 0, 0, 0, 0]), 8)
    lp = -torch.rand(8, 5, generator=torch.Generator().manual_seed(0))
    for agg in AGG_MODES:
        loss, m = grpo_loss(lp, lp, lp, adv, torch.ones(8, 5), agg=agg)
        assert abs(loss.item()) < 1e-6
        assert m["kl_mean"] == 0.0


@pytest.mark.parametrize(
    "new_p, adv_sign, objective_ratio, clipped_side",
    [
        (0.9, +1, 1.2, "high"),  # ratio 1.8, A>0: clipped to 1.2
        (0.9, -1, 1.8, None),    # ratio 1.8, A<0: unclipped 1.8A is the pessimistic side
        (0.2, +1, 0.4, None),    # ratio 0.4, A>0: unclipped 0.4A
        (0.2, -1, 0.8, "low"),   # ratio 0.4, A<0: clipped to 0.8
    ],
)
def test_seed003_clip_cases(new_p, adv_sign, objective_ratio, clipped_side):
    a_val = adv_sign * 0.935
    logp = torch.tensor([[math.log(new_p)]], dtype=D, requires_grad=True)
    old = torch.tensor([[math.log(0.5)]], dtype=D)
    per_tok, m = policy_loss(logp, old, torch.tensor([a_val], dtype=D), torch.ones(1, 1))
    assert per_tok.item() == pytest.approx(-objective_ratio * a_val, abs=1e-12)
    assert m["clip_frac_high"] == (1.0 if clipped_side == "high" else 0.0)
    assert m["clip_frac_low"] == (1.0 if clipped_side == "low" else 0.0)
    assert m["clip_frac"] == (1.0 if clipped_side else 0.0)
    per_tok.sum().backward()
    if clipped_side:
        assert logp.grad.item() == 0.0  # clipped side is constant in theta
    else:
        assert logp.grad.item() == pytest.approx(-a_val * new_p / 0.5)


def test_dual_clip():
    logp = torch.log(torch.tensor([[5.0, 2.0, 5.0, 0.1]], dtype=D)).T  # ratios vs old = 0
    old = torch.zeros(4, 1, dtype=D)
    adv = torch.tensor([-1.0, -1.0, 1.0, -1.0], dtype=D)
    per_tok, m = policy_loss(logp, old, adv, torch.ones(4, 1), dual_clip=3.0)
    # A<0, ratio 5: min(max(5, 1.2), 3) = 3 ; ratio 2: 2 ; A>0 ratio 5: -1.2 ; A<0 ratio 0.1: 0.8
    assert per_tok.squeeze(1).tolist() == pytest.approx([3.0, 2.0, -1.2, 0.8])
    assert m["dual_clip_frac"] == 0.25
    no_dual, _ = policy_loss(logp, old, adv, torch.ones(4, 1))
    assert no_dual[0].item() == pytest.approx(5.0)
    with pytest.raises(ValueError, match="dual_clip"):
        policy_loss(logp, old, adv, torch.ones(4, 1), dual_clip=1.0)


def test_token_log_ratio_clamped_and_masked_padding_exact_zero():
    logp = torch.tensor([[0.0, -30.0, float("-inf")]], requires_grad=True)
    old = torch.tensor([[-30.0, 0.0, float("-inf")]])
    mask = torch.tensor([[True, True, False]])
    per_tok, m = policy_loss(logp, old, torch.tensor([1.0]), mask, clip_low=None, clip_high=None)
    assert per_tok[0, 0].item() == pytest.approx(-math.exp(20), rel=1e-5)
    assert per_tok[0, 1].item() == pytest.approx(-math.exp(-20), rel=1e-5)
    assert per_tok[0, 2].item() == 0.0
    assert m["ratio_max"] == pytest.approx(math.exp(20), rel=1e-5)
    per_tok.sum().backward()
    assert torch.isfinite(logp.grad).all() and logp.grad[0, 2] == 0


def test_sequence_level_gspo():
    logp, old, _, adv = rand_logps(3, 5, seed=2, spread=0.05)
    mask = ragged_mask([5, 3, 1], 5)
    lp = logp.clone().requires_grad_(True)
    per_tok, m = policy_loss(lp, old, adv, mask, ratio_level="sequence", clip_low=None, clip_high=None)
    seq_ratio = torch.exp(((logp - old) * mask).sum(-1) / mask.sum(-1))
    torch.testing.assert_close(per_tok, -(adv * seq_ratio)[:, None] * mask)
    assert m["ratio_max"] == pytest.approx(float(seq_ratio.max()))
    loss = aggregate(per_tok, mask, "seq-mean-token-mean")
    loss.backward()
    # GSPO gradient: d/dlogp_t [-(1/B) sum_i A_i s_i] = -(A_i s_i / B) * m_t / n_i
    expected = -(adv * seq_ratio / 3)[:, None] * mask / mask.sum(-1, keepdim=True)
    torch.testing.assert_close(lp.grad, expected)
    # sequence log-ratio clamp at 10
    big, _ = policy_loss(old + 15, old, torch.ones(3, dtype=D), mask, ratio_level="sequence", clip_high=None)
    torch.testing.assert_close(big, -math.exp(10) * mask)
    # clipping acts on the sequence ratio: every token of a row is clipped together
    _, mc = policy_loss(old + 1.0, old, torch.ones(3, dtype=D), mask, ratio_level="sequence")
    assert mc["clip_frac_high"] == 1.0


def test_seed001_no_grad_old_policy_gradient():
    logp, _, _, adv = rand_logps(3, 4, seed=4)
    mask = ragged_mask([4, 2, 3], 4)
    lp = logp.clone().requires_grad_(True)
    loss, m = grpo_loss(lp, lp.detach(), None, adv, mask, beta=0.0)
    assert m["ratio_mean"] == 1.0
    loss.backward()
    torch.testing.assert_close(lp.grad, -adv[:, None] * mask / mask.sum(-1, keepdim=True) / 3)


# ---------------------------------------------------------------- aggregation

def test_aggregate_by_hand_ragged():
    lengths, t = [3, 1, 0, 2], 4
    mask = ragged_mask(lengths, t)
    loss = torch.arange(1.0, 17.0, dtype=D).view(4, 4)  # rows: 1..4, 5..8, 9..12, 13..16
    row_sums = [1 + 2 + 3, 5, 0, 13 + 14]  # 6, 5, 0, 27 -> total 38 over 6 tokens
    assert aggregate(loss, mask, "token-mean").item() == pytest.approx(38 / 6)
    assert aggregate(loss, mask, "seq-mean-token-mean").item() == pytest.approx((6 / 3 + 5 / 1 + 0 + 27 / 2) / 4)
    assert aggregate(loss, mask, "seq-mean-token-sum").item() == pytest.approx(38 / 4)
    assert aggregate(loss, mask, "seq-mean-token-sum-norm").item() == pytest.approx(38 / 16)
    assert aggregate(loss, mask, "seq-mean-token-sum-norm", max_len=10).item() == pytest.approx(38 / 40)
    assert sum(row_sums) == 38
    for mk in (mask.bool(), mask.int()):
        assert aggregate(loss, mk, "token-mean").item() == pytest.approx(38 / 6)


@pytest.mark.parametrize("mode", AGG_MODES)
def test_aggregate_all_masked_no_nan(mode):
    loss = torch.full((3, 4), float("nan"), dtype=D, requires_grad=True)
    out = aggregate(loss, torch.zeros(3, 4), mode)
    assert out.item() == 0.0
    out.backward()
    assert (loss.grad == 0).all()
    empty = aggregate(torch.zeros(0, 4), torch.zeros(0, 4), mode)
    assert empty.item() == 0.0 and empty.dim() == 0
    lp = torch.zeros(2, 3)
    total, m = grpo_loss(lp, lp, lp, torch.ones(2), torch.zeros(2, 3), agg=mode)
    assert total.item() == 0.0 and all(math.isfinite(v) for v in m.values())


@pytest.mark.parametrize("mode", AGG_MODES)
def test_micro_batches_sum_to_whole(mode):
    logp, old, ref, adv = rand_logps(7, 5, seed=9)
    mask = ragged_mask([5, 0, 2, 4, 1, 3, 5], 5)
    per_tok, _ = policy_loss(logp, old, adv, mask)
    whole = aggregate(per_tok, mask, mode)
    whole_full, _ = grpo_loss(logp, old, ref, adv, mask, agg=mode)
    n_tok, n_seq = mask.sum(), mask.shape[0]
    parts, parts_full = [], []
    for sl in (slice(0, 3), slice(3, 4), slice(4, 7)):
        parts.append(aggregate(per_tok[sl], mask[sl], mode, global_tokens=n_tok, global_seqs=n_seq))
        parts_full.append(grpo_loss(logp[sl], old[sl], ref[sl], adv[sl], mask[sl], agg=mode,
                                    global_tokens=n_tok, global_seqs=n_seq)[0])
    torch.testing.assert_close(sum(parts), whole)
    torch.testing.assert_close(sum(parts_full), whole_full)


def test_aggregate_errors():
    with pytest.raises(ValueError, match="unknown aggregation"):
        aggregate(torch.zeros(2, 2), torch.ones(2, 2), "sum")
    with pytest.raises(ValueError, match="mask shape"):
        aggregate(torch.zeros(2, 2), torch.ones(2, 3))


# ---------------------------------------------------------------- gradcheck

@pytest.mark.parametrize("dual_clip", [None, 3.0])
def test_gradcheck_policy_loss_token(dual_clip):
    logp, old, _, adv = rand_logps(3, 4, seed=11, spread=0.4)
    mask = ragged_mask([4, 2, 3], 4)
    fn = lambda a, b: policy_loss(a, b, adv, mask, dual_clip=dual_clip)[0]  # noqa: E731
    assert torch.autograd.gradcheck(fn, (logp.requires_grad_(True), old.requires_grad_(True)))


def test_gradcheck_policy_loss_sequence():
    # The GSPO trick gives the true sequence gradient of the *aggregated* (seq-mean-token-mean)
    # loss, not of each per-token entry (old_logp only enters detached), so check the scalar.
    logp, old, _, adv = rand_logps(3, 4, seed=12, spread=0.1)
    mask = ragged_mask([4, 2, 3], 4)
    fn = lambda a: aggregate(policy_loss(a, old, adv, mask, ratio_level="sequence")[0], mask)  # noqa: E731
    assert torch.autograd.gradcheck(fn, (logp.requires_grad_(True),))


@pytest.mark.parametrize("agg", AGG_MODES)
@pytest.mark.parametrize("kl_kind", ["k3", "low_var_kl"])
def test_gradcheck_grpo_loss_and_aggregate(agg, kl_kind):
    logp, old, ref, adv = rand_logps(3, 4, seed=13, spread=0.4)
    mask = ragged_mask([4, 0, 3], 4)
    fn = lambda a, r: grpo_loss(a, old, r, adv, mask, beta=0.1, kl_kind=kl_kind, agg=agg)[0]  # noqa: E731
    assert torch.autograd.gradcheck(fn, (logp.requires_grad_(True), ref.requires_grad_(True)))
    assert torch.autograd.gradcheck(lambda x: aggregate(x, mask, agg), (torch.randn(3, 4, dtype=D, requires_grad=True),))


# ---------------------------------------------------------------- grpo_loss API

def test_grpo_loss_metrics_and_conventions():
    logp, old, ref, adv = rand_logps(4, 6, seed=3, spread=0.4)
    mask = ragged_mask([6, 3, 1, 4], 6)
    loss, m = grpo_loss(logp, old, ref, adv, mask, beta=0.04)
    assert loss.dim() == 0
    for key in ("clip_frac_low", "clip_frac_high", "clip_frac", "ratio_mean", "ratio_max", "ratio_min",
                "dual_clip_frac", "kl_mean", "loss_policy", "loss_kl", "loss"):
        assert isinstance(m[key], float), key
    assert m["loss"] == pytest.approx(m["loss_policy"] + m["loss_kl"])
    assert m["clip_frac"] == pytest.approx(m["clip_frac_low"] + m["clip_frac_high"])
    assert m["ratio_min"] <= m["ratio_mean"] <= m["ratio_max"]
    # advantages [B] vs [B, 1]; masks float / bool / int
    for a in (adv, adv[:, None]):
        for mk in (mask, mask.bool(), mask.long()):
            l2, _ = grpo_loss(logp, old, ref, a, mk, beta=0.04)
            assert l2.item() == pytest.approx(loss.item(), abs=1e-12)
    # beta == 0: kl_mean still reported when ref given; ref may be None
    _, m0 = grpo_loss(logp, old, ref, adv, mask, beta=0.0)
    assert m0["kl_mean"] == pytest.approx(m["kl_mean"]) and m0["loss_kl"] == 0.0
    _, mn = grpo_loss(logp, old, None, adv, mask, beta=0.0)
    assert "kl_mean" not in mn
    with pytest.raises(ValueError, match="ref_logp"):
        grpo_loss(logp, old, None, adv, mask, beta=0.1)
    with pytest.raises(ValueError, match="kl_kind"):
        grpo_loss(logp, old, ref, adv, mask, kl_kind="k5")
    with pytest.raises(ValueError, match="ratio_level"):
        grpo_loss(logp, old, ref, adv, mask, ratio_level="group")
    with pytest.raises(ValueError, match="advantages"):
        grpo_loss(logp, old, ref, adv[:3], mask)


# ---------------------------------------------------------------- seed 002 weighted NLL

def test_weighted_nll_matches_seed002_formulas():
    torch.manual_seed(0)
    k, t, v = 4, 5, 11
    logits = torch.randn(k, t, v, dtype=D)
    tokens = torch.randint(0, v, (k, t))
    mask = ragged_mask([5, 3, 4, 2], t)
    w = softmax_weights(torch.tensor([1.0, 0.0, 0.5, 0.2], dtype=D), k)
    logp = selective_log_softmax(logits, tokens)
    per_tok, m = weighted_nll_loss(logp, w, mask)
    assert (per_tok[mask == 0] == 0).all() and isinstance(m["nll_token_mean"], float)
    # seed 002 prose: L = -sum_i w_i log pi(y_i|x), log pi = sum over tokens
    prose = -(w * (logp * mask).sum(-1)).sum()
    torch.testing.assert_close(aggregate(per_tok, mask, "seq-mean-token-sum", global_seqs=1), prose)
    torch.testing.assert_close(aggregate(per_tok, mask, "seq-mean-token-sum") * k, prose)
    # seed 002 code: log_probs = -F.cross_entropy(...) (mean over the response's tokens)
    total = 0
    for i in range(k):
        tgt = tokens[i].masked_fill(mask[i] == 0, -100)
        total += w[i] * -torch.nn.functional.cross_entropy(logits[i], tgt)
    torch.testing.assert_close(aggregate(per_tok, mask, "seq-mean-token-mean", global_seqs=1), -total)


def test_weighted_nll_sgd_step_prefers_best_completion():
    # a context-free policy shared by all completions: per-position logits [T, V]
    t, v = 3, 6
    logits = torch.zeros(t, v, requires_grad=True)
    completions = torch.tensor([[0, 1, 2], [3, 4, 5], [0, 4, 2], [3, 1, 5]])
    rewards = torch.tensor([1.0, 0.0, 0.6, 0.3])
    best, worst = int(rewards.argmax()), int(rewards.argmin())
    mask = torch.ones(4, t)

    def seq_logp():
        return selective_log_softmax(logits.expand(4, t, v), completions).sum(-1)

    before = seq_logp().detach()
    per_tok, _ = weighted_nll_loss(selective_log_softmax(logits.expand(4, t, v), completions),
                                   softmax_weights(rewards, 4), mask)
    aggregate(per_tok, mask, "seq-mean-token-sum", global_seqs=1).backward()
    with torch.no_grad():
        logits -= 0.5 * logits.grad
    after = seq_logp().detach()
    assert (after[best] - after[worst]) > (before[best] - before[worst]) + 1e-3
    assert after[best] > before[best]
