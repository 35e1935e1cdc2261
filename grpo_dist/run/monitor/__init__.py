"""Monitors: W&B and console behind ``Monitor``."""

from grpo_dist.run.monitor.base import Monitor, MultiMonitor, StepTimer, non_finite
from grpo_dist.run.monitor.console import ConsoleMonitor, format_metrics
from grpo_dist.run.monitor.wandb_logger import WandbMonitor

__all__ = ["Monitor", "MultiMonitor", "StepTimer", "ConsoleMonitor", "WandbMonitor", "non_finite", "format_metrics"]
