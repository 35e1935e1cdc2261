"""Console: a rich progress bar with reward, KL and seconds per step (a plain line per step
when stdout is not a terminal, e.g. in CI or a Ray job log)."""

from __future__ import annotations

import sys

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from grpo_dist.run.monitor.base import Monitor

_SHOW = [("rollout/reward_mean", "reward", "{:.3f}"), ("train/kl", "kl", "{:.4f}"),
         ("train/loss", "loss", "{:+.4f}"), ("timing/step", "s/step", "{:.1f}"),
         ("eval/sampled_accuracy", "eval_acc", "{:.3f}")]


def format_metrics(metrics: dict[str, float]) -> str:
    return "  ".join(f"{label} {fmt.format(metrics[k])}" for k, label, fmt in _SHOW if k in metrics)


class ConsoleMonitor(Monitor):
    def __init__(self, enabled: bool = True, console: Console | None = None):
        self.console = console or Console(stderr=False)
        self.live = enabled and self.console.is_terminal and sys.stdout.isatty()
        self.enabled = enabled
        self.progress: Progress | None = None
        self.task = None

    def start(self, total_steps: int) -> None:
        self.total = total_steps
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
        else:
            print(f"step {step}/{self.total}  {info}", flush=True)

    def close(self) -> None:
        if self.progress is not None:
            self.progress.stop()
            self.progress = None
