"""Weights & Biases: online, offline (files under <output_dir>/wandb) or disabled."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from grpo_dist.monitor.base import Monitor


class WandbMonitor(Monitor):
    def __init__(self, *, mode: str, project: str, entity: str | None, name: str | None,
                 directory: str | os.PathLike, config: dict[str, Any]):
        import wandb

        self.wandb = wandb
        Path(directory).mkdir(parents=True, exist_ok=True)
        self.run = wandb.init(mode=mode, project=project, entity=entity, name=name, dir=str(directory),
                              config=config, reinit="finish_previous")
        # the x-axis of every namespace is the trainer step
        self.run.define_metric("*", step_metric="trainer/step")
        self.mode = mode

    @property
    def run_dir(self) -> str | None:
        if self.mode == "disabled":
            return None
        return str(Path(self.run.dir).parent)

    def log(self, metrics: dict[str, float], step: int) -> None:
        self.run.log({**metrics, "trainer/step": step}, step=step)

    def log_table(self, name: str, columns: list[str], rows: list[list[Any]], step: int) -> None:
        self.run.log({name: self.wandb.Table(columns=columns, data=rows), "trainer/step": step}, step=step)

    def summary(self, values: dict[str, Any]) -> None:
        for k, v in values.items():
            if isinstance(v, (int, float, str, bool)) or v is None:
                self.run.summary[k] = v

    def close(self) -> None:
        self.run.finish()
