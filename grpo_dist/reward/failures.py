"""A broken reward function never ends in success: stop early, stop late, never exit 0.

The reward workers give ``reward.failure_reward`` to completions a function failed on and count
them (``RewardResult.errors``, logged as ``reward/errors/<fn>``), so one bad batch never takes a
run down. :class:`FailureWatch` (on the driver, fed every scored batch) decides when it must:

* **at once**: a function that failed on every completion of the first step (it raised on every
  call, timed out, returned the wrong number of values, strings, ...) stops the run at the end
  of that step, with one line naming the function and the reason;
* **over a window**: once ``reward.failure_window`` steps are in, a function that failed on more
  than ``reward.max_failure_rate`` of its completions over that window stops the run (the
  trainer checkpoints first);
* **at the end**: :meth:`FailureWatch.check_run` fails a finished run in which a function failed
  on more than ``reward.max_failure_rate`` of all its completions (runs shorter than the window
  included); ``summary.json`` names the failures (:meth:`FailureWatch.report`).

``None`` is TRL's "not applicable": not a failure, counted per function
(``reward/none_frac/<fn>``); but a function that returns None for every completion of a step
failed on that step. ``reward.max_failure_rate: 1`` turns every stop off.
"""

from __future__ import annotations

from collections import deque
from typing import Any

from grpo_dist.config import RewardConfig
from grpo_dist.types import RewardResult


class RewardFailureError(RuntimeError):
    """A reward function failed too often. ``fn``; ``reason`` (its first failure, one line);
    ``traceback`` ('' when none was sent); ``first_step`` (it failed on the whole first step);
    ``rate`` over ``scored`` completions of the last ``window`` steps (0 = the whole run)."""

    subject = "the function"  # what the user is told to fix

    def __init__(self, message: str, fn: str, reason: str, traceback: str, *, first_step: bool = False,
                 rate: float = 1.0, scored: int = 0, window: int = 0):
        super().__init__(message)
        self.fn, self.reason, self.traceback, self.first_step = fn, reason, traceback, first_step
        self.rate, self.scored, self.window = rate, scored, window

    def details(self) -> str:
        """``first failure of 'fn': <reason>`` and the traceback (or stuck stack) when one was sent."""
        head = f"first failure of {self.fn!r}: {self.reason or 'unknown (see the reward log)'}"
        return f"{head}\n{self.traceback.rstrip()}" if self.traceback.strip() else head


def all_none(values: list) -> bool:
    return bool(values) and all(v is None for v in values)


class FailureWatch:
    """Failure counts per reward function: this step, the last ``failure_window`` steps, the run."""

    def __init__(self, cfg: RewardConfig):
        self.limit, self.window = float(cfg.max_failure_rate), int(cfg.failure_window)
        self.steps: deque[tuple[int, dict[str, int]]] = deque(maxlen=self.window)
        self.first: dict[str, tuple[str, str]] = {}  # fn -> (reason, traceback) of its first failure
        self.run_steps, self.run_scored = 0, 0
        self.run_failed: dict[str, int] = {}
        self.run_none: dict[str, int] = {}
        self._scored, self._errors, self._none = 0, {}, {}

    def observe(self, scores: RewardResult) -> None:
        """One scoring call of this step (a step may have several: dynamic sampling refills)."""
        self._scored += len(scores.total)
        for k, v in scores.per_function.items():
            self._none[k] = self._none.get(k, 0) + sum(x is None for x in v)
            self._errors.setdefault(k, 0)
        for k, v in scores.errors.items():
            self._errors[k] = self._errors.get(k, 0) + int(v)
            if v and k not in self.first:
                self.first[k] = (scores.reasons.get(k, ""), scores.tracebacks.get(k, ""))
        for k, v in scores.tracebacks.items():  # a traceback sent by a worker whose reason came earlier
            if k in self.first and not self.first[k][1]:
                self.first[k] = (self.first[k][0], v)

    def end_step(self) -> dict[str, float]:
        """Close this step; ``reward/failure_rate/<fn>`` over the window so far and
        ``reward/none_frac/<fn>`` of this step. Raises RewardFailureError as the module doc says."""
        scored, errors, none = self._scored, dict(self._errors), dict(self._none)
        self._scored, self._errors, self._none = 0, {}, {}
        for k, n in none.items():  # None for every completion of the step: the function failed on it
            if scored and n == scored:
                errors[k] = scored
                self.first.setdefault(k, (f"returned None (not applicable) for all {scored} completions", ""))
        self.steps.append((scored, errors))
        self.run_steps += 1
        self.run_scored += scored
        for k, v in errors.items():
            self.run_failed[k] = self.run_failed.get(k, 0) + v
        for k, v in none.items():
            self.run_none[k] = self.run_none.get(k, 0) + v
        window = sum(n for n, _ in self.steps)
        names = list(dict.fromkeys(k for _, e in self.steps for k in e))
        rates = {k: sum(e.get(k, 0) for _, e in self.steps) / max(1, window) for k in names}
        if self.limit < 1.0:
            if self.run_steps == 1:
                for k in names:
                    if scored and errors.get(k, 0) == scored:
                        raise self._error(k, f"reward function {k!r} failed on all {scored} completions of the "
                                             f"first step: {self._reason(k)}", first_step=True)
            worst = max(names, key=lambda k: rates[k], default=None)
            if len(self.steps) == self.window and worst is not None and rates[worst] > self.limit:
                raise self._error(worst, f"reward function {worst!r} failed on {rates[worst]:.0%} of its {window} "
                                         f"completions over the last {self.window} steps (reward.max_failure_rate "
                                         f"{self.limit:g})", rate=rates[worst], scored=window, window=self.window)
        m = {f"reward/failure_rate/{k}": v for k, v in rates.items()}
        m.update({f"reward/none_frac/{k}": v / max(1, scored) for k, v in none.items()})
        return m

    def check_run(self) -> None:
        """Raise RewardFailureError if a function failed on more than ``reward.max_failure_rate``
        of all its completions over the whole run (the worst one is named)."""
        if self.limit >= 1.0 or not self.run_scored:
            return
        rates = {k: v / self.run_scored for k, v in self.run_failed.items()}
        worst = max(rates, key=lambda k: rates[k], default=None)
        if worst is not None and rates[worst] > self.limit:
            failed = self.run_failed[worst]
            raise self._error(worst, f"reward function {worst!r} failed on {failed} of its {self.run_scored} "
                                     f"completions ({rates[worst]:.0%}) over the whole run (reward.max_failure_rate "
                                     f"{self.limit:g})", rate=rates[worst], scored=self.run_scored)

    def report(self) -> dict[str, dict[str, Any]]:
        """Per function over the whole run: completions scored, failed, the rate, None values and
        the first failure's reason (for ``summary.json``)."""
        out: dict[str, dict[str, Any]] = {}
        for k in dict.fromkeys([*self.run_failed, *self.run_none]):
            failed = self.run_failed.get(k, 0)
            out[k] = {"scored": self.run_scored, "failed": failed, "rate": failed / max(1, self.run_scored),
                      "none": self.run_none.get(k, 0)}
            if failed and k in self.first:
                out[k]["first_failure"] = self.first[k][0]
        return out

    def state_dict(self) -> dict[str, Any]:
        """The whole run's counts (a resumed run keeps them; the window starts again)."""
        return {"steps": self.run_steps, "scored": self.run_scored, "failed": dict(self.run_failed),
                "none": dict(self.run_none), "first": {k: list(v) for k, v in self.first.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.run_steps, self.run_scored = int(state.get("steps", 0)), int(state.get("scored", 0))
        self.run_failed = {k: int(v) for k, v in state.get("failed", {}).items()}
        self.run_none = {k: int(v) for k, v in state.get("none", {}).items()}
        self.first = {k: (v[0], v[1]) for k, v in state.get("first", {}).items()}

    def _reason(self, fn: str) -> str:
        return self.first.get(fn, ("",))[0] or "unknown (see the reward log)"

    def _error(self, fn: str, message: str, **kw: Any) -> RewardFailureError:
        reason, tb = self.first.get(fn, ("", ""))
        return RewardFailureError(message, fn, reason, tb, **kw)


def whole_batch_failures(scores: RewardResult) -> dict[str, str]:
    """Functions that failed on every completion of ``scores`` (or returned None for all of
    them) -> the reason (for one batch outside training: the evaluation before it)."""
    n = len(scores.total)
    out = {}
    for k, v in scores.per_function.items():
        if n and scores.errors.get(k, 0) == n:
            out[k] = scores.reasons.get(k, "") or "unknown (see the reward log)"
        elif all_none(v):
            out[k] = f"returned None (not applicable) for all {n} completions"
    return out
