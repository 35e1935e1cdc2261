"""Monitors: W&B and console behind ``Monitor``."""

from grpo_dist.monitor.base import Monitor, MultiMonitor, StepTimer, non_finite, sync_clocks
from grpo_dist.monitor.console import ConsoleMonitor, format_metrics
from grpo_dist.monitor.wandb_logger import WandbMonitor

__all__ = ["Monitor", "MultiMonitor", "StepTimer", "ConsoleMonitor", "WandbMonitor", "non_finite", "format_metrics",
           "sync_clocks"]
