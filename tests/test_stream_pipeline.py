"""The streaming pipeline's dispatch and scoring on a real local Ray cluster and real reward actors.

The engines are the injected fault: a rollout actor on which chosen prompts take seconds
(``SlowEngine``), so that when a group finishes, and so what must happen next, is known. With
real vLLM engines on a tiny model, groups of one batch finish within a few milliseconds of each
other, too close to tell "scored at once" from "scored with the batch" on a loaded 2-core machine
(tests/test_stream_e2e.py runs the real engines).
"""

from __future__ import annotations

import time

import pytest

from grpo_dist.config import load_config

pytestmark = pytest.mark.slow
SLOW = 3.0  # seconds the slow group takes; every other group returns at once


@pytest.fixture(scope="module")
def cfg():
    from grpo_dist.cluster.ray_utils import init_ray, shutdown_ray

    c = load_config(None, {"rollout": {"backend": "vllm", "streaming": True},
                           "reward": {"num_workers": 1, "functions": [{"fn": "correctness"}]},
                           "cluster": {"num_cpus": 2}})
    init_ray(c)
    yield c
    shutdown_ray()


def _pipeline(cfg, engines: int = 2, capacity: int = 8):
    import ray

    from grpo_dist.run.workers import create_reward
    from grpo_dist.cluster.placement import ActorSpec
    from grpo_dist.cluster.ray_utils import ActorGroup
    from grpo_dist.orchestrator.stream import StreamPipeline

    class SlowEngine:
        """A streaming rollout actor's ``generate_group``, without vLLM: ``record["delay"]``
        seconds, then a group of two completions ("2", right, and "3", wrong)."""

        async def generate_group(self, record, key, min_version=0):
            import asyncio

            from grpo_dist.types import Rollout, RolloutGroup

            await asyncio.sleep(record["delay"])
            rollouts = [Rollout(record["id"], "1+1=", [1], c, [5], [-0.5], "stop", min_version, {"answer": "2"})
                        for c in ("2", "3")]
            return RolloutGroup(record["id"], rollouts), time.time()

    rollout = ActorGroup.create("rollout", SlowEngine, [()] * engines, spec=ActorSpec(num_cpus=0.1),
                                max_concurrency=100)
    reward = create_reward(cfg)
    # started (imports done) before the clock matters
    ray.get(rollout.call("generate_group", {"id": -1, "delay": 0}, None) + reward.call("names"))
    return StreamPipeline(rollout, reward, recovery=None, timeout=60.0, capacity=capacity)


def _records(step: int, delays: list[float]) -> list[dict]:
    return [{"id": 10 * step + i, "delay": d} for i, d in enumerate(delays)]


def test_a_finished_group_is_scored_while_its_batch_is_still_generating(cfg):
    """The slow group is submitted first; the reward actor scores the three fast ones before it
    finishes (an in-order reward actor would wait for the slow group's scoring first)."""
    p = _pipeline(cfg)
    try:
        pend = p.submit(1, _records(1, [SLOW, 0, 0, 0]), [None] * 4)
        sc = p.scored(pend)
        assert [g.prompt_id for g in sc.groups] == [10, 11, 12, 13]  # prompt order, whatever finished first
        # the three fast groups were scored before the slow one finished generating (an in-order
        # reward actor would score none of them before the slow group's scoring: 0)
        assert sc.metrics["rollout/groups_scored_early"] == 3.0, sc.metrics
        assert sc.scores.total == [1.0, 0.0] * 4  # the real reward function's scores, in prompt order
    finally:
        p.rollout.kill()
        p.reward.kill()


def test_groups_go_to_the_engine_with_the_least_outstanding_work(cfg):
    """Static shards would put the second batch's groups on engines [0, 1, 0]; engine 0 still
    holds the slow group, so the pipeline sends them to [1, 0, 1]. The buffer refuses a batch past
    its capacity."""
    from grpo_dist.orchestrator.stream import BufferFull

    p = _pipeline(cfg, capacity=7)
    try:
        first = p.submit(1, _records(1, [SLOW, 0, 0, 0]), [None] * 4)
        assert [it.rank for it in first.items] == [0, 1, 0, 1]
        deadline = time.time() + SLOW / 2
        while p.outstanding() != [1, 0] and time.time() < deadline:
            time.sleep(0.02)
        assert p.outstanding() == [1, 0]  # the fast groups are done, the slow one is not
        second = p.submit(2, _records(2, [0, 0, 0]), [None] * 3)
        assert [it.rank for it in second.items] == [1, 0, 1]
        assert p.buffered() == 7 == p.buffer_peak
        with pytest.raises(BufferFull, match="capacity 7"):
            p.submit(3, _records(3, [0]), [None])
        assert len(p.queue) == 2  # the refused batch was not queued
        per_engine = [p.scored(pend).metrics for pend in (first, second)]
        assert [(m["rollout/groups_on_engine/0"], m["rollout/groups_on_engine/1"]) for m in per_engine] == \
            [(2.0, 2.0), (1.0, 2.0)]
    finally:
        p.rollout.kill()
        p.reward.kill()
