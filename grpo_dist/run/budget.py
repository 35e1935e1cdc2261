"""``trainer.max_minutes``: the time budget of a run's steps (this process's), checked before each
step at the mean step time so far."""

from __future__ import annotations

import time
from typing import Optional


class TimeBudget:
    """``exhausted(step, steps)`` is True (once, with a line saying so) when the next step, at this
    process's mean step time so far, would end past ``minutes``; never before a first step."""

    def __init__(self, minutes: Optional[float]):
        self.minutes = minutes
        self._t0: Optional[float] = None  # when this process's first step started
        self._steps0 = 0

    def exhausted(self, step: int, steps: int) -> bool:
        if self.minutes is None:
            return False
        now = time.perf_counter()
        if self._t0 is None:
            self._t0, self._steps0 = now, step
            return False
        done, elapsed = step - self._steps0, now - self._t0
        if done == 0 or elapsed + elapsed / done <= self.minutes * 60:
            return False
        print(f"trainer.max_minutes {self.minutes:g}: stopping after step {step} of {steps} "
              f"({elapsed / 60:.1f} min of steps, {elapsed / done:.0f} s each)", flush=True)
        return True
