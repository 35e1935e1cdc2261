"""From scored groups to TrainBatch: advantages dispatch, reward shaping, rollout metrics."""

from __future__ import annotations

import math

import pytest

from grpo_dist.batch import build_batch, compute_advantages, overlong_penalty, zero_spread
from grpo_dist.config import load_config
from grpo_dist.types import RewardResult, Rollout, RolloutGroup


def groups(rewards_per_group, lengths=None, finish=None):
    out, k = [], 0
    for gi, rs in enumerate(rewards_per_group):
        rolls = []
        for _ in rs:
            n = lengths[k] if lengths else 3
            rolls.append(Rollout(prompt_id=gi, prompt="p", prompt_ids=[1, 2], completion="c",
                                 completion_ids=list(range(n)), logprobs=[-1.0] * n,
                                 finish_reason=(finish[k] if finish else "stop"), adapter_version=3,
                                 columns={"answer": "4"}))
            k += 1
        out.append(RolloutGroup(prompt_id=gi, rollouts=rolls))
    return out


def scores(flat):
    return RewardResult(total=list(flat), per_function={"correctness": list(flat)}, errors={"correctness": 1})


def test_seed003_advantages_through_the_config():
    r = [1, 1, 1, 1, 0, 0, 0, 0]
    grpo = load_config(None, ["--algo.preset", "grpo"]).algo
    nb = load_config(None, ["--algo.preset", "seed_notebook"]).algo
    assert compute_advantages(r, 8, grpo)[0] == pytest.approx(0.9354, abs=1e-3)
    assert compute_advantages(r, 8, nb)[0] == pytest.approx(1.0, abs=1e-6)
    rloo = load_config(None, ["--algo.preset", "rloo"]).algo
    assert compute_advantages(r, 8, rloo)[0] == pytest.approx(1 - 3 / 7)
    sw = load_config(None, ["--algo.preset", "softmax_weighted"]).algo
    w = compute_advantages(r, 8, sw)
    assert sum(w) == pytest.approx(1.0) and w[0] > w[-1]


def test_build_batch_contiguous_groups_and_metrics():
    algo = load_config(None, []).algo
    g = groups([[1, 0], [1, 1]], lengths=[2, 4, 3, 3], finish=["stop", "length", "stop", "stop"])
    batch, m = build_batch(g, scores([1, 0, 1, 1]), 2, algo, max_tokens=4)
    assert len(batch) == 4 and batch.adapter_versions == [3] * 4
    assert batch.advantages[0] > 0 > batch.advantages[1] and batch.advantages[2:] == [0.0, 0.0]
    assert m["rollout/reward_mean"] == 0.75 and m["rollout/frac_reward_zero_std"] == 0.5
    assert m["rollout/truncated_frac"] == 0.25 and m["rollout/completion_length_max"] == 4
    assert m["reward/correctness"] == 0.75 and m["reward/errors/correctness"] == 1.0
    assert all(math.isfinite(v) for v in m.values())
    with pytest.raises(ValueError, match="group_size"):
        build_batch(g, scores([1, 0, 1, 1]), 4, algo, max_tokens=4)


def test_mask_truncated_and_overlong_shaping():
    algo = load_config(None, ["--algo.mask_truncated", "true", "--algo.overlong_buffer", "0.5"]).algo
    g = groups([[1, 1]], lengths=[2, 4], finish=["stop", "length"])
    batch, m = build_batch(g, scores([1, 1]), 2, algo, max_tokens=4)
    assert batch.loss_mask == [[1.0, 1.0], [0.0] * 4]
    assert m["rollout/overlong_penalty_mean"] == -0.5  # the overlong one loses the full penalty (0 and -1)
    assert batch.advantages[0] > batch.advantages[1]
    assert overlong_penalty(2, 8, 0.25, 1.0) == 0.0
    assert overlong_penalty(7, 8, 0.25, 1.0) == pytest.approx(-0.5)
    assert overlong_penalty(8, 8, 0.25, 1.0) == -1.0
    assert zero_spread([0.5, 0.5]) and not zero_spread([0.5, 0.6])


def _trajectory(mask, stop):
    n = len(mask)
    return Rollout(prompt_id=0, prompt="p", prompt_ids=[1, 2], completion="c", completion_ids=list(range(n)),
                   logprobs=[-1.0 if m else 0.0 for m in mask], finish_reason="stop" if stop == "done" else "length",
                   adapter_version=0, loss_mask=list(mask), turns=2, stop_reason=stop)


def test_multi_turn_length_shaping_and_masking_count_sampled_tokens_and_length_limits():
    # 4 trajectories of 10 tokens each: 6 sampled (two turns of 3) and 4 of the environment's
    mask = [1, 1, 1, 0, 0, 0, 0, 1, 1, 1]
    stops = ["done", "budget", "max_turns", "context"]
    rolls = [_trajectory(mask, s) for s in stops] + [_trajectory([1] * 3 + [0] * 7, "length")] + \
        [_trajectory([1] * 3 + [0] * 7, "timeout")]
    assert [r.sampled_length for r in rolls] == [6, 6, 6, 6, 3, 3]
    # a length limit cut them: length, budget, context; not max_turns, timeout (or env_error)
    assert [r.cut_by_length for r in rolls] == [False, True, False, True, True, False]
    g = [RolloutGroup(prompt_id=0, rollouts=rolls)]
    algo = load_config(None, ["--algo.mask_truncated", "true", "--algo.overlong_buffer", "0.5"]).algo
    # the trajectory's budget is 8 sampled tokens: the penalty runs from 4 to 8 (6 -> -0.5; 3 -> 0)
    batch, m = build_batch(g, scores([1.0] * 6), 6, algo, max_tokens=8)
    assert batch.loss_mask == [[float(x) for x in mask], [0.0] * 10, [float(x) for x in mask], [0.0] * 10,
                               [0.0] * 10, [1.0] * 3 + [0.0] * 7]
    assert m["rollout/overlong_penalty_mean"] == pytest.approx(-0.5 * 4 / 6)


def test_the_sampled_budget_of_a_trajectory():
    r = load_config(None, {"rollout": {"max_tokens": 16}}).rollout
    assert not r.multi_turn and r.sampled_budget == 16
    r = load_config(None, {"rollout": {"max_tokens": 16, "env": "calculator", "max_turns": 3}}).rollout
    assert r.multi_turn and r.sampled_budget == 48
    r = load_config(None, {"rollout": {"max_tokens": 16, "env": "calculator", "max_total_tokens": 40}}).rollout
    assert r.sampled_budget == 40
    r = load_config(None, {"rollout": {"max_tokens": 8, "rollout_fn": "m:f", "max_turns": 2}}).rollout
    assert r.multi_turn and r.sampled_budget == 16


def test_overlong_shaping_fires_in_the_calculator_config():
    """configs/calculator_smollm2.yaml cuts a trajectory at max_total_tokens, environment tokens
    included; the dapo preset's shaping must count the same tokens (sampled ones alone never reach
    the buffer: 3 turns x 48 <= 192 - 48)."""
    from pathlib import Path

    cfg = load_config(Path(__file__).parents[1] / "configs" / "calculator_smollm2.yaml", ["--algo.preset", "dapo"])
    budget, all_tokens = cfg.rollout.overlong_budget
    assert (budget, all_tokens) == (192, True) and cfg.algo.overlong_buffer == 0.25

    def traj(total, sampled, stop):
        return Rollout(prompt_id=0, prompt="p", prompt_ids=[1, 2], completion="c", completion_ids=[5] * total,
                       logprobs=[-1.0] * total, finish_reason="length", adapter_version=0,
                       loss_mask=[1] * sampled + [0] * (total - sampled), turns=3, stop_reason=stop)

    g = [RolloutGroup(prompt_id=0, rollouts=[traj(180, 100, "budget"), traj(60, 40, "done")])]
    _, m = build_batch(g, scores([1, 1]), 2, cfg.algo, budget, all_tokens=all_tokens)
    assert m["rollout/overlong_penalty_mean"] == pytest.approx(overlong_penalty(180, 192, 0.25, 1.0) / 2)
    assert overlong_penalty(180, 192, 0.25, 1.0) == pytest.approx(-0.75)
    single = load_config(None, ["--algo.preset", "dapo", "--rollout.max_tokens", "32"]).rollout
    assert single.overlong_budget == (32, False)
