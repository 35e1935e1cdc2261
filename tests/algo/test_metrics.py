import itertools
import math

import pytest
import torch

from grpo_dist.algo import masked_mean, masked_sum, pass_at_k, quantile


@pytest.mark.parametrize(
    "n, c, k, expected",
    [(5, 2, 1, 0.4), (5, 2, 2, 0.7), (4, 0, 1, 0.0), (4, 0, 4, 0.0), (3, 3, 1, 1.0), (3, 3, 3, 1.0),
     (10, 1, 1, 0.1), (5, 4, 2, 1.0), (10, 3, 4, 1 - 35 / 210)],
)
def test_pass_at_k_hand_values(n, c, k, expected):
    assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)


def test_pass_at_k_brute_force():
    for n in range(1, 8):
        for c in range(n + 1):
            samples = [1] * c + [0] * (n - c)
            for k in range(1, n + 1):
                subsets = list(itertools.combinations(range(n), k))
                brute = sum(any(samples[i] for i in s) for s in subsets) / len(subsets)
                assert pass_at_k(n, c, k) == pytest.approx(brute, abs=1e-12), (n, c, k)
                assert pass_at_k(n, c, k) == pytest.approx(1 - math.comb(n - c, k) / math.comb(n, k), abs=1e-12)


def test_pass_at_k_large_n_stable():
    v = pass_at_k(1000, 3, 100)
    assert 0 < v < 1 and v == pytest.approx(1 - math.comb(997, 100) / math.comb(1000, 100), rel=1e-9)


@pytest.mark.parametrize("args", [(3, 4, 1), (3, 1, 4), (-1, 0, 1), (3, -1, 1), (3, 1, 0), (3, 1, -2), (3.5, 1, 1)])
def test_pass_at_k_errors(args):
    with pytest.raises(ValueError):
        pass_at_k(*args)


def test_masked_mean_and_sum():
    x = torch.tensor([[1.0, 2.0, float("nan")], [4.0, float("inf"), 6.0]])
    m = torch.tensor([[1, 1, 0], [1, 0, 1]])
    assert masked_sum(x, m).item() == 13.0
    assert masked_mean(x, m).item() == 13.0 / 4
    assert masked_mean(x, m.bool(), dim=-1).tolist() == [1.5, 5.0]
    assert masked_mean(x, m.float(), dim=-1).tolist() == [1.5, 5.0]
    assert masked_mean(x, torch.zeros(2, 3)).item() == 0.0
    assert masked_mean(x, torch.tensor([[0, 0, 0], [1, 0, 0]]), dim=-1).tolist() == [0.0, 4.0]


def test_loss_metrics_as_tensors_are_the_floats_unread():
    """tensor_metrics=True: the same names, as detached 0-d float64 tensors (nothing read to the
    host); float() of each is exactly the float the default returns."""
    from grpo_dist.algo import grpo_loss, policy_loss, rollout_is_weights, weighted_nll_loss

    g = torch.Generator().manual_seed(0)
    logp = (-torch.rand(3, 5, generator=g, dtype=torch.float64) * 2).requires_grad_()
    old, ref = logp.detach() + 0.3 * torch.randn(3, 5, generator=g, dtype=torch.float64), logp.detach() - 0.1
    adv, mask = torch.tensor([1.0, -0.5, 2.0], dtype=torch.float64), torch.tensor([[1] * 5, [1] * 3 + [0] * 2, [0] * 5])
    calls = {
        "policy_loss": lambda **kw: policy_loss(logp, old, adv, mask, dual_clip=3.0, **kw),
        "weighted_nll_loss": lambda **kw: weighted_nll_loss(logp, adv, mask, **kw),
        "grpo_loss": lambda **kw: grpo_loss(logp, old, ref, adv, mask, is_weights=torch.ones(3, 5), **kw),
        "rollout_is_weights": lambda **kw: rollout_is_weights(old, logp.detach(), mask, "mask", **kw),
    }
    for name, call in calls.items():
        floats, tensors = call()[1], call(tensor_metrics=True)[1]
        assert floats and list(tensors) == list(floats), name
        assert all(type(v) is float for v in floats.values()), name
        for k, t in tensors.items():
            assert isinstance(t, torch.Tensor) and t.shape == () and t.dtype == torch.float64, (name, k)
            assert not t.requires_grad and float(t) == floats[k], (name, k)


@pytest.mark.parametrize("q", [0.0, 0.2, 0.5, 0.75, 1.0])
def test_quantile_matches_torch_on_small_inputs(q):
    x = torch.tensor([3.0, -1.0, 7.5, 2.0, 2.0, 10.0, 0.5])
    assert float(quantile(x, q)) == pytest.approx(float(torch.quantile(x, q)), abs=1e-6)
    # hand value: sorted [-1, .5, 2, 2, 3, 7.5, 10]; q=0.75 -> rank 4.5 -> (3 + 7.5) / 2
    assert float(quantile(x, 0.75)) == pytest.approx(5.25)
    assert quantile(x.bfloat16(), 0.75).dtype == torch.bfloat16


def test_quantile_scales_past_torch_quantile_limit():
    # top_entropy_frac pools every completion token of a batch: past 2**24 values torch.quantile raises
    n = (1 << 24) + 3
    x = torch.arange(n, dtype=torch.float32).flip(0)  # descending: torch.kthvalue(x, 1) takes quadratic time
    assert float(quantile(x, 0.0)) == 0.0 and float(quantile(x, 1.0)) == float(n - 1)
    assert float(quantile(x, 0.5)) == pytest.approx((n - 1) / 2)
    with pytest.raises(ValueError):
        quantile(x[:0], 0.5)
