"""Rollout importance sampling weights (TIS / masked IS, token and sequence level) against
hand-computed numbers, and how they enter the GRPO loss."""

import math

import pytest
import torch

from grpo_dist.algo import aggregate, grpo_loss, kl_penalty, policy_loss, rollout_is_weights

D = torch.float64
# log-ratios old - behaviour: row 0: +0.5, -1.0, 0.0; row 1: -0.8, +2.0, (padding)
OLD = torch.tensor([[-1.0, -2.0, -0.5], [-1.0, -1.0, 0.0]], dtype=D)
BEH = torch.tensor([[-1.5, -1.0, -0.5], [-0.2, -3.0, -math.inf]], dtype=D)  # -inf in padding must not leak
MASK = torch.tensor([[1, 1, 1], [1, 1, 0]])
E = math.exp


def close(got, want):
    assert torch.allclose(got, torch.tensor(want, dtype=D), rtol=0, atol=1e-12), (got, want)


def test_token_truncate_hand_numbers():
    w, m = rollout_is_weights(OLD, BEH, MASK, "truncate", "token", threshold=2.0)
    close(w, [[E(0.5), E(-1.0), 1.0], [E(-0.8), 2.0, 0.0]])
    assert m["is_clipped_frac"] == pytest.approx(1 / 5)
    assert m["is_weight_max"] == pytest.approx(2.0)
    assert m["is_ratio_max"] == pytest.approx(E(2.0))
    assert m["is_weight_mean"] == pytest.approx((E(0.5) + E(-1.0) + 1.0 + E(-0.8) + 2.0) / 5)
    assert "is_masked_frac" not in m


def test_token_mask_hand_numbers_default_and_explicit_lower_bound():
    w, m = rollout_is_weights(OLD, BEH, MASK, "mask", "token", threshold=2.0)  # bounds [0.5, 2]
    close(w, [[E(0.5), 0.0, 1.0], [0.0, 0.0, 0.0]])  # e^-1, e^-0.8 < 0.5 and e^2 > 2 dropped
    assert m["is_masked_frac"] == pytest.approx(3 / 5)
    assert m["is_weight_mean"] == pytest.approx((E(0.5) + 1.0) / 5)
    assert m["is_weight_max"] == pytest.approx(E(0.5)) and m["is_ratio_max"] == pytest.approx(E(2.0))
    assert "is_clipped_frac" not in m
    w, m = rollout_is_weights(OLD, BEH, MASK, "mask", "token", threshold=2.0, threshold_low=0.3)
    close(w, [[E(0.5), E(-1.0), 1.0], [E(-0.8), 0.0, 0.0]])
    assert m["is_masked_frac"] == pytest.approx(1 / 5)


def test_sequence_level_is_the_product_over_the_completion():
    # row 0: 0.5 - 1.0 + 0.0 = -0.5; row 1: -0.8 + 2.0 = 1.2 (the padded position does not count)
    w, m = rollout_is_weights(OLD, BEH, MASK, "truncate", "sequence", threshold=2.0)
    close(w, [[E(-0.5)] * 3, [2.0, 2.0, 0.0]])
    assert m["is_clipped_frac"] == pytest.approx(2 / 5)  # a row counts with its tokens
    assert m["is_ratio_max"] == pytest.approx(E(1.2))
    assert m["is_weight_mean"] == pytest.approx((3 * E(-0.5) + 2 * 2.0) / 5)
    w, m = rollout_is_weights(OLD, BEH, MASK, "mask", "sequence", threshold=2.0)
    close(w, [[E(-0.5)] * 3, [0.0, 0.0, 0.0]])  # 0.61 in [0.5, 2] kept; 3.32 dropped as a whole
    assert m["is_masked_frac"] == pytest.approx(2 / 5)
    w, _ = rollout_is_weights(OLD, BEH, MASK, "mask", "sequence", threshold=4.0)  # bounds [0.25, 4]
    close(w, [[E(-0.5)] * 3, [E(1.2), E(1.2), 0.0]])


def test_masked_positions_exactly_zero_and_huge_ratios_do_not_overflow():
    old = torch.tensor([[0.0, -1.0, -2.0, -3.0]], dtype=torch.float32)
    beh = torch.tensor([[-500.0, -1.0, float("nan"), -math.inf]], dtype=torch.float32)
    mask = torch.tensor([[True, True, False, False]])
    for mode in ("truncate", "mask"):
        for level in ("token", "sequence"):
            w, m = rollout_is_weights(old, beh, mask, mode, level, threshold=3.0)
            assert w.dtype == torch.float32 and torch.isfinite(w).all()
            assert w[0, 2].item() == 0.0 and w[0, 3].item() == 0.0
            assert all(math.isfinite(v) for v in m.values())
            assert w.max().item() <= 3.0
            assert m["is_ratio_max"] == pytest.approx(math.exp(20.0), rel=1e-5)  # the +-20 clamp


def test_none_is_the_identity_on_the_loss():
    g = torch.Generator().manual_seed(0)
    logp = -torch.rand(4, 5, generator=g, dtype=D) * 2
    old = logp + 0.1 * torch.randn(4, 5, generator=g, dtype=D)
    ref = logp + 0.1 * torch.randn(4, 5, generator=g, dtype=D)
    beh = logp + 0.3 * torch.randn(4, 5, generator=g, dtype=D)
    adv = torch.randn(4, generator=g, dtype=D)
    mask = (torch.arange(5)[None] < torch.tensor([5, 3, 1, 0])[:, None]).to(D)
    w, m = rollout_is_weights(old, beh, mask, "none")
    assert m == {} and torch.equal(w, mask)
    base, bm = grpo_loss(logp, old, ref, adv, mask, beta=0.04)
    same, sm = grpo_loss(logp, old, ref, adv, mask, beta=0.04, is_weights=w)
    assert torch.equal(base, same) and bm == sm


@pytest.mark.parametrize("agg", ["seq-mean-token-mean", "token-mean"])
@pytest.mark.parametrize("mode,level", [("truncate", "token"), ("mask", "sequence")])
def test_weights_multiply_the_per_token_policy_loss_not_the_kl(agg, mode, level):
    g = torch.Generator().manual_seed(1)
    logp = (-torch.rand(4, 5, generator=g, dtype=D) * 2).requires_grad_()
    old = logp.detach() + 0.05 * torch.randn(4, 5, generator=g, dtype=D)
    ref = logp.detach() + 0.1 * torch.randn(4, 5, generator=g, dtype=D)
    beh = old + 0.5 * torch.randn(4, 5, generator=g, dtype=D)
    adv = torch.randn(4, generator=g, dtype=D)
    mask = (torch.arange(5)[None] < torch.tensor([5, 4, 2, 1])[:, None]).to(D)
    w, _ = rollout_is_weights(old.requires_grad_(), beh, mask, mode, level, threshold=1.5)
    assert not w.requires_grad
    assert (w != 1).any() and (w[mask.bool()] > 0).any()
    beta = 0.04
    loss, metrics = grpo_loss(logp, old.detach(), ref, adv, mask, beta=beta, agg=agg, is_weights=w)
    per_token, _ = policy_loss(logp, old.detach(), adv, mask)
    kl = kl_penalty(logp, ref, "k3") * mask
    want = aggregate(w * per_token + beta * kl, mask, agg)
    assert torch.allclose(loss, want, rtol=0, atol=1e-12)
    assert metrics["loss_policy"] == pytest.approx(float(aggregate(w * per_token.detach(), mask, agg)), abs=1e-12)
    # the gradient is the weighted policy gradient: d loss / d logp = w * d policy / d logp + beta * d kl
    (g1,) = torch.autograd.grad(loss, logp)
    (g2,) = torch.autograd.grad(want, logp)
    assert torch.allclose(g1, g2, atol=1e-12)
    # [B] weights broadcast over the row like [B, T] ones
    row_w = torch.tensor([0.5, 1.0, 2.0, 0.0], dtype=D)
    a, _ = grpo_loss(logp, old.detach(), ref, adv, mask, beta=beta, agg=agg, is_weights=row_w)
    b, _ = grpo_loss(logp, old.detach(), ref, adv, mask, beta=beta, agg=agg, is_weights=row_w[:, None].expand(4, 5))
    assert torch.allclose(a, b, atol=1e-12)


@pytest.mark.parametrize("kwargs,match", [
    (dict(mode="clip"), "mode"),
    (dict(level="geometric"), "level"),
    (dict(threshold=0.0), "threshold must be > 0"),
    (dict(mode="truncate", threshold_low=0.5), "only used by mode 'mask'"),
    (dict(mode="mask", threshold=2.0, threshold_low=3.0), "threshold_low"),
    (dict(mode="mask", threshold=2.0, threshold_low=0.0), "threshold_low"),
])
def test_bad_arguments_raise(kwargs, match):
    with pytest.raises(ValueError, match=match):
        rollout_is_weights(OLD, BEH, MASK, **kwargs)


def test_shape_mismatch_raises():
    with pytest.raises(ValueError, match="same"):
        rollout_is_weights(OLD, BEH[:, :2], MASK)
