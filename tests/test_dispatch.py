"""Dispatch by outstanding work (pure functions, no Ray) and the staleness bookkeeping."""

from __future__ import annotations

import random

import pytest

from grpo_dist.batch import staleness_metrics
from grpo_dist.orchestrator.dispatch import assign_chunks, chunk_bounds, merge_in_order, split


def test_auto_chunks_are_todays_static_shards():
    """chunk 0: one contiguous range per engine, cut like split() (so k = 0 runs send the same
    prompts to the same engines as before); empty ranges are never sent."""
    for n in range(0, 12):
        for engines in (1, 2, 3, 5):
            bounds = chunk_bounds(n, engines)
            shards = [s for s in split(list(range(n)), engines) if s]
            assert [list(range(lo, hi)) for lo, hi in bounds] == shards, (n, engines)
    assert chunk_bounds(4, 2) == [(0, 2), (2, 4)]
    assert assign_chunks([2, 2], [0, 0]) == [0, 1]  # idle engines: chunk i -> engine i


def test_fixed_size_chunks_cover_the_batch_once():
    assert chunk_bounds(10, 2, chunk=3) == [(0, 3), (3, 6), (6, 9), (9, 10)]
    assert chunk_bounds(0, 2, chunk=3) == []
    assert chunk_bounds(4, 3, chunk=8) == [(0, 4)]


def test_each_chunk_goes_to_the_engine_with_the_fewest_outstanding_prompts():
    assert assign_chunks([2, 2, 2, 2], [0, 0]) == [0, 1, 0, 1]
    # engine 0 still has 6 prompts of earlier batches: the first three chunks go to engine 1
    assert assign_chunks([2, 2, 2, 2], [6, 0]) == [1, 1, 1, 0]
    assert assign_chunks([4, 4], [5, 0, 1]) == [1, 2]
    assert assign_chunks([1], [3, 3, 3]) == [0]  # ties: the lowest rank
    counts = [7, 0]
    assign_chunks([1, 1], counts)
    assert counts == [7, 0]  # the caller's counts are not modified


def test_a_slow_engine_gets_less_work_over_many_batches():
    """Simulation: engine 1 finishes 1 prompt per tick, engine 0 four; a batch of 4 prompts in
    chunks of 2 every tick. The slow engine ends up with a small share, not half."""
    speed, outstanding, got = [4, 1], [0, 0], [0, 0]
    for _ in range(200):
        for r, size in zip(assign_chunks([2] * 2, outstanding), [2] * 2):
            outstanding[r] += size
            got[r] += size
        outstanding = [max(0, o - s) for o, s in zip(outstanding, speed)]
    assert got[1] < 0.3 * sum(got) and got[0] > 0.7 * sum(got)


def test_results_are_merged_in_prompt_order_whoever_ran_them():
    groups = [f"g{i}" for i in range(10)]
    bounds = chunk_bounds(10, 3, chunk=3)
    parts = [(lo, groups[lo:hi]) for lo, hi in bounds]
    random.Random(0).shuffle(parts)  # engines answer in any order
    assert merge_in_order(parts) == groups


def test_staleness_metrics_count_each_value_and_enforce_the_bound():
    m = staleness_metrics([3, 3, 2, 1], learner_version=3, max_staleness=2)
    assert m["rollout/staleness_max"] == 2.0 and m["rollout/staleness_mean"] == 0.75
    assert m["rollout/staleness"] == 0.75  # the earlier name, kept
    assert {k: v for k, v in m.items() if "count" in k} == {
        "rollout/staleness_count/0": 2.0, "rollout/staleness_count/1": 1.0, "rollout/staleness_count/2": 1.0}
    assert staleness_metrics([5] * 4, 5, 0)["rollout/staleness_max"] == 0.0
    with pytest.raises(ValueError, match="max_staleness"):
        staleness_metrics([1, 3], 4, 2)  # 3 versions behind, bound 2
    with pytest.raises(ValueError):
        staleness_metrics([5], 4, 2)  # newer than the learner: a bookkeeping bug
