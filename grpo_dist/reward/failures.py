"""Stop a run whose reward function keeps failing, instead of training on the fallback reward.

The reward workers give ``reward.failure_reward`` to completions a function failed on and count
them (``RewardResult.errors``, logged as ``reward/errors/<fn>``), so one bad batch never takes a
run down. :class:`FailureWatch` (on the driver) keeps, per step, how many completions were
scored and how many each function failed on; once ``reward.failure_window`` steps are in, a
function that failed on more than ``reward.max_failure_rate`` of its completions over that
window raises :class:`RewardFailureError`, naming the function, the rate and its first traceback
(which the worker sends with the first failure, ``RewardResult.tracebacks``). The trainer then
checkpoints and stops.
"""

from __future__ import annotations

from collections import deque

from grpo_dist.config import RewardConfig


class RewardFailureError(RuntimeError):
    """A reward function failed too often: ``fn``, ``rate`` over ``scored`` completions, and
    ``traceback`` (its first failure's traceback text, or '' when none was sent)."""

    def __init__(self, fn: str, rate: float, scored: int, window: int, limit: float, traceback: str):
        self.fn, self.rate, self.scored, self.window, self.limit, self.traceback = (
            fn, rate, scored, window, limit, traceback)
        super().__init__(f"reward function {fn!r} failed on {rate:.0%} of its {scored} completions over the last "
                         f"{window} steps (reward.max_failure_rate {limit:g})")

    def details(self) -> str:
        tb = self.traceback.rstrip() or "(no traceback: it timed out or returned bad values; see the reward log)"
        return f"first failure of {self.fn!r}:\n{tb}"


class FailureWatch:
    """Failure rates per reward function over the last ``failure_window`` steps."""

    def __init__(self, cfg: RewardConfig):
        self.limit, self.window = float(cfg.max_failure_rate), int(cfg.failure_window)
        self.steps: deque[tuple[int, dict[str, int]]] = deque(maxlen=self.window)
        self.first_traceback: dict[str, str] = {}
        self._scored, self._errors = 0, {}

    def observe(self, scored: int, errors: dict[str, int], tracebacks: dict[str, str] | None = None) -> None:
        """One scoring call of this step: ``scored`` completions, ``errors[fn]`` failed ones."""
        self._scored += int(scored)
        for k, v in errors.items():
            self._errors[k] = self._errors.get(k, 0) + int(v)
        for k, v in (tracebacks or {}).items():
            self.first_traceback.setdefault(k, v)

    def end_step(self) -> dict[str, float]:
        """Close this step; ``reward/failure_rate/<fn>`` over the window so far. Raises
        RewardFailureError once the window is full and a function is past the limit."""
        self.steps.append((self._scored, self._errors))
        self._scored, self._errors = 0, {}
        scored = sum(n for n, _ in self.steps)
        names = sorted({k for _, e in self.steps for k in e})
        rates = {k: sum(e.get(k, 0) for _, e in self.steps) / max(1, scored) for k in names}
        if len(self.steps) == self.window and self.limit < 1.0:
            worst = max(names, key=lambda k: rates[k], default=None)
            if worst is not None and rates[worst] > self.limit:
                raise RewardFailureError(worst, rates[worst], scored, self.window, self.limit,
                                         self.first_traceback.get(worst, ""))
        return {f"reward/failure_rate/{k}": v for k, v in rates.items()}
