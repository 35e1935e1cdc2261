"""Console: a rich progress bar with reward, KL and seconds per step (a plain line per step, with
each reward function's mean and an ETA, when stdout is not a terminal: CI, a Ray job log)."""

from __future__ import annotations

import sys
import time

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from grpo_dist.run.monitor.base import Monitor

_SHOW = [("rollout/reward_mean", "reward", "{:.3f}"), ("train/kl", "kl", "{:.4f}"),
         ("train/loss", "loss", "{:+.4f}"), ("timing/step", "s/step", "{:.1f}"),
         ("eval/sampled_accuracy", "eval_acc", "{:.3f}")]


def format_metrics(metrics: dict[str, float]) -> str:
    """The step line's fields: reward, each reward function's mean (``reward/<fn>``, when there
    are several), KL, loss, seconds per step, eval accuracy."""
    parts = [f"{label} {fmt.format(metrics[k])}" for k, label, fmt in _SHOW if k in metrics]
    fns = sorted(k for k in metrics if k.startswith("reward/") and k.count("/") == 1)
    if len(fns) > 1:
        parts.insert(1, "(" + " ".join(f"{k[7:]} {metrics[k]:.3f}" for k in fns) + ")")
    return "  ".join(parts)


def eta(seconds: float) -> str:
    s = int(round(seconds))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"


class ConsoleMonitor(Monitor):
    def __init__(self, enabled: bool = True, console: Console | None = None, max_minutes: float | None = None,
                 prefix: str = ""):
        """``max_minutes`` (trainer.max_minutes): the ETA is at most what is left of that budget.
        ``prefix``: an adapter of several: plain lines that start with its name (no live bar)."""
        self.max_minutes, self.prefix = max_minutes, prefix
        self.console = console or Console(stderr=False)
        self.live = enabled and self.console.is_terminal and sys.stdout.isatty() and not prefix
        self.enabled = enabled
        self.progress: Progress | None = None
        self.task = None

    def start(self, total_steps: int) -> None:
        self.total = total_steps
        self._t0, self._first = time.perf_counter(), None
        if self.live:
            self.progress = Progress(TextColumn("[bold]GRPO"), BarColumn(), MofNCompleteColumn(),
                                     TextColumn("{task.fields[info]}"), TimeRemainingColumn(),
                                     console=self.console)
            self.progress.start()
            self.task = self.progress.add_task("train", total=total_steps, info="")

    def log(self, metrics: dict[str, float], step: int) -> None:
        if not self.enabled or not any(k.startswith(("train/", "eval/")) for k in metrics):
            return
        info = format_metrics(metrics)
        if self.progress is not None:
            self.progress.update(self.task, completed=step, info=info)
            return
        if self._first is None:  # the ETA counts from the first step logged here (a resume starts late)
            self._first = (step - 1, time.perf_counter() - metrics.get("timing/step", 0.0))
        done, t_first = self._first
        left = ""
        if step < self.total and step > done:
            spent = time.perf_counter() - t_first
            seconds, why = spent / (step - done) * (self.total - step), ""
            if self.max_minutes is not None and self.max_minutes * 60 - spent < seconds:
                seconds, why = max(0.0, self.max_minutes * 60 - spent), " (trainer.max_minutes)"
            left = f"  eta {eta(seconds)}{why}"
        print(f"{'[' + self.prefix + '] ' if self.prefix else ''}step {step}/{self.total}  {info}{left}", flush=True)

    def close(self) -> None:
        if self.progress is not None:
            self.progress.stop()
            self.progress = None
