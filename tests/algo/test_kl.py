import math

import pytest
import torch

from grpo_dist.algo import kl_penalty, naive_kl


def pair(seed=0):
    g = torch.Generator().manual_seed(seed)
    logp = -torch.rand(4, 9, generator=g, dtype=torch.float64) * 6
    ref = -torch.rand(4, 9, generator=g, dtype=torch.float64) * 6
    return logp, ref


@pytest.mark.parametrize("kind", ["k1", "k2", "k3", "low_var_kl"])
def test_zero_at_equality(kind):
    logp, _ = pair()
    assert kl_penalty(logp, logp.clone(), kind).abs().max() == 0


@pytest.mark.parametrize("kind", ["k2", "k3", "low_var_kl"])
def test_non_negative(kind):
    for seed in range(5):
        logp, ref = pair(seed)
        assert (kl_penalty(logp, ref, kind) >= 0).all()


def test_formulas_by_hand():
    logp = torch.tensor([[-1.0, -2.0]])
    ref = torch.tensor([[-1.5, -1.0]])
    d = logp - ref  # [0.5, -1.0]
    torch.testing.assert_close(kl_penalty(logp, ref, "k1"), d)
    torch.testing.assert_close(kl_penalty(logp, ref, "k2"), 0.5 * d**2)
    expected_k3 = torch.tensor([[math.exp(-0.5) + 0.5 - 1, math.exp(1.0) - 1.0 - 1]])
    torch.testing.assert_close(kl_penalty(logp, ref, "k3"), expected_k3)
    # low_var_kl equals k3 inside the clamps
    torch.testing.assert_close(kl_penalty(logp, ref, "low_var_kl"), expected_k3)


def test_k3_matches_seed000_form():
    logp, ref = pair(3)
    delta = logp - ref
    torch.testing.assert_close(kl_penalty(logp, ref, "k3"), torch.exp(-delta) + delta - 1)


def test_k3_asymmetry():
    # k3(delta) = exp(-delta) + delta - 1 with delta = logp - ref.
    # NOTE: seed 000's prose says the delta > 0 side ("overconfident") grows exponentially, but
    # its own formula grows exponentially for delta < 0 and only linearly for delta > 0.
    # We test the formula: for every d > 0, k3(-d) > k3(+d).
    ref = torch.zeros(6, dtype=torch.float64)
    d = torch.tensor([0.1, 0.5, 1.0, 2.0, 5.0, 10.0], dtype=torch.float64)
    pos = kl_penalty(d, ref, "k3")   # policy more likely than reference
    neg = kl_penalty(-d, ref, "k3")  # policy less likely than reference
    assert (neg > pos).all()
    torch.testing.assert_close(pos[-1], torch.tensor(math.exp(-10) + 9, dtype=torch.float64))  # ~linear
    torch.testing.assert_close(neg[-1], torch.tensor(math.exp(10) - 11, dtype=torch.float64))  # exponential


def test_low_var_kl_clamps_and_k3_unclamped():
    logp = torch.tensor([-50.0, -1.0])
    ref = torch.tensor([-1.0, -50.0])
    lv = kl_penalty(logp, ref, "low_var_kl")
    assert lv[0] == 10.0  # exp(20) - 21 clamped to 10
    assert lv[1] == 10.0  # kl = -20 (clamped from -49): exp(-20) + 20 - 1 = 19 -> clamped to 10
    assert lv.max() <= 10.0
    k3 = kl_penalty(logp, ref, "k3")
    assert k3[0] > 1e20  # exp(49) - 50: unclamped, as in the seeds and TRL


def test_low_var_kl_upper_clamp_value():
    lv = kl_penalty(torch.tensor([-1.0]), torch.tensor([-50.0]), "low_var_kl")
    assert lv.item() == 10.0  # exp(-20) + 20 - 1 = 19 -> clamped to 10


def test_unknown_kind():
    with pytest.raises(ValueError, match="unknown KL"):
        kl_penalty(torch.zeros(2), torch.zeros(2), "k4")


@pytest.mark.parametrize("kind", ["k1", "k2", "k3", "low_var_kl"])
def test_gradcheck(kind):
    logp, ref = pair(7)
    logp = (logp * 0.3).requires_grad_(True)  # keep inside low_var_kl's clamps
    ref = (ref * 0.3).requires_grad_(True)
    assert torch.autograd.gradcheck(lambda a, b: kl_penalty(a, b, kind), (logp, ref))


def test_naive_kl_seed003():
    new = torch.tensor([-0.5, -1.0, -2.0])
    old = torch.tensor([-1.0, -1.0, -1.0])
    assert naive_kl(new, old).item() == pytest.approx((0.5 + 0 - 1.0) / 3)
    mask = torch.tensor([1, 1, 0])
    assert naive_kl(new, old, mask).item() == pytest.approx(0.25)
    assert naive_kl(new, old, torch.zeros(3)).item() == 0.0
