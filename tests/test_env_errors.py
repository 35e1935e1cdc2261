"""Issue 42 item 2: a run whose environment, agent or rollout function raises on (nearly) every
trajectory does not train on zeros and exit 0 (rollout.max_env_error_rate,
grpo_dist/orchestrator/env_errors.py); the line names the first error. The CLI case is in
tests/test_failures_after_start.py."""

from __future__ import annotations

import json

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


def test_the_counts_go_into_the_checkpoint_and_a_resumed_run_judges_the_whole_run():
    """Issue 52 item 3: a run preempted after every step (each segment a new watch loaded from the
    last checkpoint's state, through JSON as trainer_state.json holds it) stops where an
    uninterrupted one stops and fails at the end as it fails; before, each segment started from
    zero: a segment's first step was taken for the run's first, and the run ended in success."""
    cfg = load_config(None, {"rollout": {"agent": "agents.py:solve"}})
    steps = [["env_error", "env_error", "env_error", "done"], ["env_error"] * 4, ["env_error", "done", "done", "done"]]
    whole, state = EnvErrorWatch(cfg.rollout, 5), {}
    for stops in steps:
        segment = EnvErrorWatch(cfg.rollout, 5)
        segment.load_state_dict(json.loads(json.dumps(state)))
        for w in (whole, segment):
            w.observe(_groups(stops))
            assert w.end_step() == {"rollout/env_error_rate": whole.run_errors / whole.run_total}
        state = segment.state_dict()
    for w in (whole, segment):
        with pytest.raises(EnvErrorRateError, match=r"ended 8 of its 12 trajectories \(67%\) over the whole run as "
                                                    r"env_error .*; first error: agent: NotFoundError"):
            w.check_run()
    first = EnvErrorWatch(cfg.rollout, 2)
    first.observe(_groups(steps[0]))
    first.end_step()
    window = EnvErrorWatch(cfg.rollout, 2)  # the window comes back too: full at the resumed run's first step
    window.load_state_dict(json.loads(json.dumps(first.state_dict())))
    window.observe(_groups(steps[0]))
    with pytest.raises(EnvErrorRateError, match=r"ended 75% of its 8 trajectories over the last 2 steps"):
        window.end_step()
    fresh = EnvErrorWatch(cfg.rollout, 2)
    fresh.load_state_dict({})  # a checkpoint from before the counts were saved: a fresh start
    assert fresh.state_dict() == EnvErrorWatch(cfg.rollout, 2).state_dict()
