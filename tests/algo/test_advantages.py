import math

import pytest
import torch

from grpo_dist.algo import group_advantages, group_reward_stats, rloo_advantages, softmax_weights

SEED3 = torch.tensor([1.0, 1, 1, 1, 0, 0, 0, 0])


def test_seed003_unbiased_std():
    adv = group_advantages(SEED3, 8)
    # mean 0.5, unbiased std sqrt(2/7) = 0.5345 -> 0.5 / (0.5345 + 1e-4) = 0.9352
    assert adv[:4].tolist() == pytest.approx([0.5 / (math.sqrt(2 / 7) + 1e-4)] * 4, abs=1e-6)
    assert round(float(adv[0]), 3) == 0.935 and round(float(adv[-1]), 3) == -0.935
    torch.testing.assert_close(adv[4:], -adv[:4])


def test_seed003_biased_std_eps_1e8():
    adv = group_advantages(SEED3, 8, std_unbiased=False, eps=1e-8)
    torch.testing.assert_close(adv, torch.tensor([1.0] * 4 + [-1.0] * 4), atol=1e-6, rtol=0)
    # seed 003's compute_advantages verbatim
    grouped = SEED3.view(1, 8)
    ref = ((grouped - grouped.mean(1, keepdim=True)) / (grouped.std(1, unbiased=False, keepdim=True) + 1e-8)).view(-1)
    torch.testing.assert_close(adv, ref)


@pytest.mark.parametrize("scale", ["group", "batch", "none"])
def test_equal_rewards_give_zeros_not_nan(scale):
    r = torch.tensor([0.1, 0.1, 0.1, 0.7, 0.7, 0.7, 1.0, 0.0, 0.5])
    adv = group_advantages(r, 3, scale=scale, eps=0.0)
    assert torch.isfinite(adv).all()
    assert adv[:6].tolist() == [0.0] * 6
    assert adv[6:].abs().sum() > 0
    assert rloo_advantages(r, 3)[:6].tolist() == [0.0] * 6
    all_same = group_advantages(torch.full((4,), 3.0), 2, scale=scale, eps=0.0)
    assert all_same.tolist() == [0.0] * 4


def test_multiple_groups_independent():
    r = torch.tensor([1.0, 0.0, 2.0, 4.0])
    adv = group_advantages(r, 2, eps=0.0)
    s = math.sqrt(0.5)  # unbiased std of [1, 0]
    assert adv.tolist() == pytest.approx([0.5 / s, -0.5 / s, -1 / (2 * s), 1 / (2 * s)])


def test_scale_batch_and_none():
    r = torch.tensor([1.0, 0.0, 2.0, 4.0])
    centred = torch.tensor([0.5, -0.5, -1.0, 1.0])
    torch.testing.assert_close(group_advantages(r, 2, scale="none"), centred)
    std_u = r.std()  # all raw rewards, unbiased
    torch.testing.assert_close(group_advantages(r, 2, scale="batch", eps=1e-4), centred / (std_u + 1e-4))
    std_b = r.std(unbiased=False)
    torch.testing.assert_close(
        group_advantages(r, 2, scale="batch", std_unbiased=False, eps=0.0), centred / std_b
    )


def test_rloo_by_hand():
    r = torch.tensor([1.0, 0.0, 0.0, 3.0, 2.0, 2.0])
    # group 1: 1 - (0+0)/2 = 1, 0 - (1+0)/2 = -0.5, -0.5 ; group 2: 3 - 2 = 1, 2 - 2.5 = -0.5, -0.5
    assert rloo_advantages(r, 3).tolist() == pytest.approx([1.0, -0.5, -0.5, 1.0, -0.5, -0.5])
    # identity: G/(G-1) * centred
    x = torch.randn(12, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(rloo_advantages(x, 4), 4 / 3 * group_advantages(x, 4, scale="none"))


def test_integer_rewards_are_floated():
    adv = group_advantages(torch.tensor([1, 0, 1, 0]), 2, scale="none")
    assert adv.dtype == torch.float32 and adv.tolist() == [0.5, -0.5, 0.5, -0.5]


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: group_advantages(torch.zeros(6), 4), "multiple of group_size"),
        (lambda: group_advantages(torch.zeros(6), 1), ">= 2"),
        (lambda: group_advantages(torch.zeros(6), 0), ">= 2"),
        (lambda: group_advantages(torch.zeros(6), 2, scale="global"), "unknown advantage scale"),
        (lambda: group_advantages(torch.zeros(2, 3), 3), "1-D"),
        (lambda: group_advantages(torch.tensor([1.0, float("nan")]), 2), "NaN"),
        (lambda: rloo_advantages(torch.zeros(5), 2), "multiple"),
        (lambda: softmax_weights(torch.zeros(4), 2, temperature=0.0), "temperature"),
        (lambda: softmax_weights(torch.zeros(4), 2, temperature=-1.0), "temperature"),
        (lambda: softmax_weights(torch.zeros(3), 2), "multiple"),
    ],
)
def test_value_errors(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_softmax_weights_seed002():
    r = torch.tensor([1.0, 0.0, 0.5, 0.2, 3.0, 3.0, 3.0, 3.0])
    w = softmax_weights(r, 4)
    torch.testing.assert_close(w.view(2, 4).sum(1), torch.ones(2))
    torch.testing.assert_close(w[:4], torch.softmax(r[:4], 0))
    assert w[4:].tolist() == pytest.approx([0.25] * 4)  # equal rewards -> uniform
    assert int(w[:4].argmax()) == 0


def test_softmax_weights_temperature():
    r = torch.tensor([1.0, 0.0, 0.5, 0.2])
    cold = softmax_weights(r, 4, temperature=0.01)
    hot = softmax_weights(r, 4, temperature=100.0)
    assert float(cold[0]) > 0.999
    assert (hot - 0.25).abs().max() < 0.01
    mid = softmax_weights(r, 4, temperature=0.5)
    torch.testing.assert_close(mid, torch.softmax(r / 0.5, 0))
    # lower temperature -> more weight on the best completion
    assert cold[0] > mid[0] > softmax_weights(r, 4)[0] > hot[0]


def test_group_reward_stats():
    r = torch.tensor([1.0, 1.0, 0.0, 1.0, 0.5, 0.5])
    s = group_reward_stats(r, 2)
    assert all(isinstance(v, float) for v in s.values())
    assert s["reward_mean"] == pytest.approx(4 / 6)
    assert s["reward_std"] == pytest.approx(float(r.std()))
    assert s["frac_reward_zero_std"] == pytest.approx(2 / 3)
    assert s["reward_group_std_mean"] == pytest.approx(math.sqrt(0.5) / 3)
