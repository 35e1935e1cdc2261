"""A run whose environment, agent or rollout function keeps raising never trains on it and ends in success.

A trajectory whose environment (``reset`` / ``step``), agent or rollout function raised ends with
stop reason ``env_error`` and goes into the batch (one bad trajectory never takes a run down); its
rewards are then mostly zeros. :class:`EnvErrorWatch` (on the driver, fed every generated batch)
stops the run as ``reward/failures.py`` does for reward functions, at ``rollout.max_env_error_rate``
over ``reward.failure_window`` steps: at once when every trajectory of the first step ended so;
past the rate over the window; and :meth:`EnvErrorWatch.check_run` fails a finished run past it.
The error names the first exception (``Rollout.error``: where, type and first line). Its counts go
into each checkpoint (:meth:`EnvErrorWatch.state_dict`): a resumed run judges the whole run and the
window as an uninterrupted one would, so a run preempted more often than the window still stops.
"""

from __future__ import annotations

from collections import deque
from typing import Any

from grpo_dist.reward.failures import RewardFailureError
from grpo_dist.types import StopReason


class EnvErrorRateError(RewardFailureError):
    """Too many trajectories ended as env_error; the message names the first error (one line)."""

    subject = "it"

    def details(self) -> str:
        return ""  # the message names the first error already


def source_name(r: Any) -> str:
    """What produced the trajectories of ``rollout`` config ``r``, for the message."""
    if getattr(r, "agent", None):
        return f"rollout.agent {r.agent!r}"
    if getattr(r, "rollout_fn", None):
        return f"rollout.rollout_fn {r.rollout_fn!r}"
    return f"the environment ({'rollout.env_column ' + repr(r.env_column) if r.env_column else repr(r.env)})"


class EnvErrorWatch:
    def __init__(self, r: Any, window: int):
        self.limit, self.window, self.name = float(r.max_env_error_rate), int(window), source_name(r)
        self.steps: deque[tuple[int, int]] = deque(maxlen=self.window)  # (trajectories, env_errors) per step
        self.first: str | None = None
        self.run_steps = self.run_total = self.run_errors = 0
        self._total = self._errors = 0

    def observe(self, groups: list) -> None:
        """The groups of one generation call of this step (dynamic sampling may make several)."""
        for g in groups:
            for r in g.rollouts:
                self._total += 1
                if r.stop_reason == StopReason.ENV_ERROR:
                    self._errors += 1
                    if self.first is None:
                        self.first = r.error or "unknown (it gave no exception: see workers.log)"

    def end_step(self) -> dict[str, float]:
        """Close this step; ``rollout/env_error_rate`` over the window so far. Raises
        EnvErrorRateError as the module doc says."""
        total, errors, self._total, self._errors = self._total, self._errors, 0, 0
        self.steps.append((total, errors))
        self.run_steps, self.run_total, self.run_errors = self.run_steps + 1, self.run_total + total, self.run_errors + errors
        seen, bad = sum(n for n, _ in self.steps), sum(e for _, e in self.steps)
        rate = bad / max(1, seen)
        if self.limit < 1.0:
            if self.run_steps == 1 and total and errors == total:
                raise self._error(f"all {total} trajectories of the first step", first_step=True)
            if len(self.steps) == self.window and rate > self.limit:
                raise self._error(f"{rate:.0%} of its {seen} trajectories over the last {self.window} steps",
                                  rate=rate, scored=seen, window=self.window)
        return {"rollout/env_error_rate": rate}

    def check_run(self) -> None:
        """Raise EnvErrorRateError if more than the rate of all trajectories of the run ended as env_error."""
        rate = self.run_errors / max(1, self.run_total)
        if self.limit < 1.0 and self.run_total and rate > self.limit:
            raise self._error(f"{self.run_errors} of its {self.run_total} trajectories ({rate:.0%}) over the whole run",
                              rate=rate, scored=self.run_total)

    def state_dict(self) -> dict[str, Any]:
        """The counts of the finished steps: the whole run's and the window's (JSON, for a checkpoint)."""
        return {"steps": self.run_steps, "total": self.run_total, "errors": self.run_errors, "first": self.first,
                "window": [list(s) for s in self.steps]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """A checkpoint's counts (``{}``, a checkpoint from before they were saved: a fresh start)."""
        self.run_steps, self.run_total = int(state.get("steps", 0)), int(state.get("total", 0))
        self.run_errors, self.first = int(state.get("errors", 0)), state.get("first")
        self.steps.clear()
        self.steps.extend((int(n), int(e)) for n, e in state.get("window", []))  # (maxlen: the current window)

    def _error(self, what: str, **kw: Any) -> EnvErrorRateError:
        first = self.first or "unknown"
        return EnvErrorRateError(f"{self.name} ended {what} as env_error (rollout.max_env_error_rate {self.limit:g}); "
                                 f"first error: {first}", self.name, first, "", **kw)
