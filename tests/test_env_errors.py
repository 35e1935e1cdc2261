"""Issue 42 item 2: a run whose environment, agent or rollout function raises on (nearly) every
trajectory does not train on zeros and exit 0 (rollout.max_env_error_rate,
grpo_dist/orchestrator/env_errors.py); the line names the first error. The CLI case is in
tests/test_failures_after_start.py."""

from __future__ import annotations

import pytest

from grpo_dist.config import load_config
from grpo_dist.orchestrator.env_errors import EnvErrorRateError, EnvErrorWatch
from grpo_dist.types import Rollout, RolloutGroup


def _groups(stops: list[str], error: str = "agent: NotFoundError: Error code: 404") -> list[RolloutGroup]:
    return [RolloutGroup(0, [Rollout(0, "p", [1], "", [], [], "length", 0, stop_reason=s,
                                     error=error if s == "env_error" else None) for s in stops])]


def _watch(**rollout) -> EnvErrorWatch:
    cfg = load_config(None, {"rollout": {"agent": "agents.py:solve", **rollout}, "reward": {"failure_window": 2}})
    return EnvErrorWatch(cfg.rollout, cfg.reward.failure_window)


def test_every_trajectory_of_the_first_step_failing_stops_at_once_naming_the_first_error():
    w = _watch()
    w.observe(_groups(["env_error"] * 4))
    w.observe(_groups(["env_error"] * 4, error="agent: second"))
    with pytest.raises(EnvErrorRateError) as e:
        w.end_step()
    assert str(e.value) == ("rollout.agent 'agents.py:solve' ended all 8 trajectories of the first step as env_error "
                            "(rollout.max_env_error_rate 0.5); first error: agent: NotFoundError: Error code: 404")
    assert e.value.first_step and e.value.details() == "" and e.value.subject == "it"


def test_the_rate_over_the_window_and_over_the_whole_run():
    w = _watch()
    w.observe(_groups(["env_error", "env_error", "env_error", "done"]))
    assert w.end_step() == {"rollout/env_error_rate": 0.75}  # not all: the run goes on until the window is full
    with pytest.raises(EnvErrorRateError, match=r"ended 3 of its 4 trajectories \(75%\) over the whole run as "):
        w.check_run()  # a run that ended here (shorter than the window) fails
    w.observe(_groups(["env_error", "env_error", "env_error", "done"]))
    with pytest.raises(EnvErrorRateError, match=r"^rollout.agent 'agents.py:solve' ended 75% of its 8 trajectories "
                                                r"over the last 2 steps as env_error"):
        w.end_step()
    fine = _watch()
    for _ in range(3):
        fine.observe(_groups(["env_error", "done", "done", "done"]))
        assert fine.end_step() == {"rollout/env_error_rate": 0.25}
    fine.check_run()
    off = _watch(max_env_error_rate=1.0)  # 1 = never
    off.observe(_groups(["env_error"] * 4))
    off.end_step()
    off.check_run()
