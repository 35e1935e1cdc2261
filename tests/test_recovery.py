"""Which failures Recovery replaces (decision logic only; the real replacement of dead Ray actors
is tested end to end in test_presets_e2e.py)."""

from __future__ import annotations

import pytest

from grpo_dist.cluster.ray_utils import ClusterError
from grpo_dist.cluster.recovery import Recovery
from grpo_dist.config import config_from_dict


class Recording(Recovery):
    """Records replacements instead of starting actors (fault-injection double)."""

    def __init__(self, max_restarts: int):
        super().__init__(config_from_dict({"cluster": {"max_restarts": max_restarts}}), None, lambda: None)
        self.replaced: list[tuple[str, int]] = []
        self.silent: list[bool] = []

    def replace(self, role: str, rank: int, silent: bool = False) -> None:
        self.replaced.append((role, rank))
        self.silent.append(silent)


@pytest.mark.parametrize("err", [
    ClusterError("learner worker 0 died: RayActorError", "learner", 0, dead=True),
    ClusterError("rollout worker 1 failed: ValueError: bad prompt", "rollout", 1, dead=False),
    ClusterError("rollout worker ? died: RayActorError", "rollout", None, dead=True),
    ClusterError("cluster: actors need 9 CPU but the cluster has 2"),
])
def test_not_replaceable_errors_propagate_unchanged(err):
    rec = Recording(max_restarts=5)
    with pytest.raises(ClusterError) as e:
        rec.handle(err)
    assert e.value is err and rec.replaced == [] and rec.restarts == 0


def test_dead_workers_are_replaced_within_the_budget_and_the_call_reissued():
    rec = Recording(max_restarts=2)
    calls = []

    def dispatch(x):
        calls.append(x)
        if len(calls) == 1:
            raise ClusterError("rollout worker 1 died: RayActorError", "rollout", 1, dead=True)
        if len(calls) == 2:
            raise ClusterError("reward worker 0 died: RayActorError", "reward", 0, dead=True)
        return x * 2

    assert rec.run(dispatch, 21) == 42
    assert calls == [21, 21, 21] and rec.replaced == [("rollout", 1), ("reward", 0)] and rec.restarts == 2
    with pytest.raises(ClusterError, match=r"^rollout worker 0 died: X \(cluster.max_restarts=2 replacements used up\)$"):
        rec.handle(ClusterError("rollout worker 0 died: X", "rollout", 0, dead=True))
    assert rec.restarts == 2


def test_a_hung_worker_is_replaced_like_a_dead_one():
    rec = Recording(max_restarts=1)
    rec.handle(ClusterError("rollout worker 0: no answer within 20 s", "rollout", 0, hung=True))
    assert rec.replaced == [("rollout", 0)]
    assert rec.silent == [True]  # a silent actor's node is probed before its replacement (node_loss)
    with pytest.raises(ClusterError, match="no answer within 20 s .*used up") as e:
        rec.handle(ClusterError("rollout worker 1: no answer within 20 s", "rollout", 1, hung=True))
    assert e.value.hung and not e.value.dead


class FailsToStart(Recording):
    """The first ``n`` replacements die while they start (their engine process killed)."""

    def __init__(self, max_restarts: int, n: int, hung: bool = False):
        super().__init__(max_restarts)
        self.n, self.hung = n, hung

    def replace(self, role: str, rank: int, silent: bool = False) -> None:
        super().replace(role, rank, silent)
        if len(self.replaced) <= self.n:
            raise ClusterError(f"{role} worker {rank}: engine process VLLM::EngineCore (pid 9) gone", role, rank,
                               dead=not self.hung, hung=self.hung)


@pytest.mark.parametrize("hung", [False, True])
def test_a_replacement_that_dies_while_it_starts_is_replaced_again_within_the_budget(hung):
    rec = FailsToStart(max_restarts=3, n=1, hung=hung)
    rec.handle(ClusterError("rollout worker 0 died: RayActorError", "rollout", 0, dead=True))
    assert rec.replaced == [("rollout", 0), ("rollout", 0)] and rec.restarts == 2
    assert rec.silent == [False, hung]  # a dead one is not probed: Ray knows where it stands
    rec = FailsToStart(max_restarts=2, n=5, hung=hung)
    with pytest.raises(ClusterError, match=r"engine process .* gone \(cluster.max_restarts=2 replacements used up\)$"):
        rec.handle(ClusterError("rollout worker 0 died: RayActorError", "rollout", 0, dead=True))
    assert rec.restarts == 2


def test_a_replacement_that_raises_while_it_starts_stops_the_run():
    """A start that fails on its own (a bug, a config the engine refuses) is not retried."""

    class Raises(Recording):
        def replace(self, role, rank, silent=False):
            super().replace(role, rank, silent)
            raise ClusterError(f"{role} worker {rank} failed: ValueError: no room for the KV cache", role, rank)

    rec = Raises(max_restarts=5)
    with pytest.raises(ClusterError, match="no room for the KV cache$"):
        rec.handle(ClusterError("rollout worker 0 died: RayActorError", "rollout", 0, dead=True))
    assert rec.restarts == 1


def test_a_stop_request_ends_the_lost_node_wait_and_nothing_is_replaced():
    """Issue 42 B3: after the first Ctrl-C the probe of a silent actor's node (up to 130 s) is not
    entered, and the silent actor is not replaced: the run stops (``interrupted``). The same wait
    answering a stop request mid-way on a lost node: tests/test_node_loss.py."""
    import time
    from types import SimpleNamespace

    from grpo_dist.cluster import ray_utils
    from grpo_dist.cluster.node_loss import await_lost_node

    ray_utils.request_stop()
    try:
        t0 = time.monotonic()
        assert await_lost_node(object(), "rollout worker 0") == "stopped"
        rec = Recovery(config_from_dict({"cluster": {"max_restarts": 3}}),
                       SimpleNamespace(rollout=SimpleNamespace(actors=[object()])))
        with pytest.raises(ClusterError, match=r"^rollout worker 0: silent, and a stop was requested") as e:
            rec.handle(ClusterError("rollout worker 0: no heartbeat for 60 s", "rollout", 0, hung=True))
        assert e.value.interrupted and time.monotonic() - t0 < 1.0
    finally:
        ray_utils.request_stop(False)
