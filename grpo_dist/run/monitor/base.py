"""Monitoring behind one small base class: W&B (online/offline/disabled) and the console."""

from __future__ import annotations

import abc
import contextlib
import math
import time
from typing import Any


class Monitor(abc.ABC):
    def start(self, total_steps: int) -> None:
        pass

    @abc.abstractmethod
    def log(self, metrics: dict[str, float], step: int) -> None:
        """Namespaced scalars: rollout/…, reward/…, train/…, sync/…, timing/…, perf/…, eval/…"""

    def log_table(self, name: str, columns: list[str], rows: list[list[Any]], step: int) -> None:
        pass

    def summary(self, values: dict[str, Any]) -> None:
        pass

    def check(self) -> None:
        """Raise ``disk.WriteError`` when a file this monitor writes could not be written."""

    def close(self) -> None:
        pass


class MultiMonitor(Monitor):
    def __init__(self, monitors: list[Monitor]):
        self.monitors = monitors

    def start(self, total_steps: int) -> None:
        for m in self.monitors:
            m.start(total_steps)

    def log(self, metrics, step):
        for m in self.monitors:
            m.log(metrics, step)

    def log_table(self, name, columns, rows, step):
        for m in self.monitors:
            m.log_table(name, columns, rows, step)

    def summary(self, values):
        for m in self.monitors:
            m.summary(values)

    def check(self):
        for m in self.monitors:
            m.check()

    def close(self):
        for m in self.monitors:
            m.close()


def non_finite(metrics: dict[str, float]) -> list[str]:
    """Names of metrics that are NaN or infinite (the run refuses to go on silently)."""
    return [k for k, v in metrics.items() if isinstance(v, float) and not math.isfinite(v)]


class StepTimer:
    """Accumulates named phase durations of one step; ``metrics()`` gives ``timing/<phase>``,
    ``timing/step`` and ``timing/other``: the step's time outside every phase (the phases do not nest)."""

    def __init__(self):
        self.t: dict[str, float] = {}
        self.start = time.perf_counter()

    @contextlib.contextmanager
    def __call__(self, name: str):
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.t[name] = self.t.get(name, 0.0) + time.perf_counter() - t0

    def metrics(self) -> dict[str, float]:
        m = {f"timing/{k}": v for k, v in self.t.items()}
        m["timing/step"] = time.perf_counter() - self.start
        m["timing/other"] = max(0.0, m["timing/step"] - sum(self.t.values()))
        return m
