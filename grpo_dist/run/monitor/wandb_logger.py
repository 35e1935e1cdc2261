"""Weights & Biases: online, offline (files under <output_dir>/wandb) or disabled."""

from __future__ import annotations

import errno
import os
import re
from pathlib import Path
from typing import Any

from grpo_dist.run.monitor.base import Monitor
from grpo_dist.util.disk import WriteError

# wandb-core's log line when it could not write a record (0.31): "... write <path>: no space left on device"
_FAILED_WRITE = re.compile(r"failed to save record: .*?write (/\S+): ([^\"]+)")
_CAUSES = {"no space left on device": errno.ENOSPC, "disk quota exceeded": errno.EDQUOT,
           "read-only file system": errno.EROFS, "permission denied": errno.EACCES}


class WandbMonitor(Monitor):
    def __init__(self, *, mode: str, project: str, entity: str | None, name: str | None,
                 directory: str | os.PathLike, config: dict[str, Any], run_id: str | None = None,
                 group: str | None = None):
        import wandb

        self.wandb = wandb
        Path(directory).mkdir(parents=True, exist_ok=True)
        # run_id: a resumed run (same trainer.run_id) continues the same W&B run
        self.run = wandb.init(mode=mode, project=project, entity=entity, name=name, dir=str(directory),
                              config=config, reinit="create_new" if group else "finish_previous", id=run_id,
                              group=group,
                              resume="allow" if run_id else None)
        # the x-axis of every namespace is the trainer step
        self.run.define_metric("*", step_metric="trainer/step")
        self.mode = mode
        self._log_seen = 0  # how far check() has read W&B's own log

    @classmethod
    def from_config(cls, cfg, *, default_name: str | None = None, config: dict[str, Any] | None = None,
                    group: str | None = None) -> "WandbMonitor":
        """The W&B run of ``cfg.logging`` (mode, project, entity, ``run_name`` else
        ``default_name``), its files under ``cfg.output_dir``; ``config`` (what the run records as
        its config) defaults to the whole config tree. Online with W&B out of reach, it logs
        offline (``wandb_check.wandb_mode``)."""
        if config is None:
            import yaml

            from grpo_dist.config import dump_config

            config = yaml.safe_load(dump_config(cfg))
        from grpo_dist.run.monitor.wandb_check import wandb_mode

        lg = cfg.logging
        # online with W&B out of reach: offline (pre-flight said so; decided once per process)
        return cls(mode=wandb_mode(lg), project=lg.project, entity=lg.entity, name=lg.run_name or default_name,
                   directory=cfg.output_dir, config=config, run_id=getattr(cfg.trainer, "run_id", None),
                   group=group)

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

    def check(self) -> None:
        """W&B writes its files in a process of its own: a write that fails there (a full or
        read-only disk) raises nothing here and the records are lost. Its log says so; the first
        such line since the last check becomes a ``WriteError`` naming the file. (Where that log
        cannot be written either, the run's own files in the same directory fail first.)"""
        if self.mode == "disabled":
            return
        log = Path(self.run.dir).parent / "logs" / "debug-internal.log"
        try:
            with open(log, "rb") as f:
                f.seek(self._log_seen)
                new = f.read()
        except OSError:
            return
        end = new.rfind(b"\n") + 1  # whole lines only
        self._log_seen += end
        for line in new[:end].decode(errors="replace").splitlines():
            m = _FAILED_WRITE.search(line) if '"ERROR"' in line else None
            if m:
                cause = m.group(2).strip()
                code = _CAUSES.get(cause.lower())
                raise WriteError(m.group(1), OSError(code, os.strerror(code) if code else cause))

    def close(self) -> None:
        self.run.finish()


def wandb_segments(cfg) -> dict[str, Any]:
    """The W&B directories of this run id under ``<output_dir>/wandb`` (one per segment: W&B
    offline starts a new directory each time a resumed run starts), oldest first, and, for those
    logged offline (by the config, or online with W&B out of reach), the one command that uploads
    them all (`wandb sync` of several directories of one run id uploads them in order of start
    time: wandb 0.31)."""
    if cfg.logging.wandb_mode == "disabled" or not cfg.trainer.run_id:
        return {}
    root = Path(cfg.output_dir) / "wandb"
    dirs = sorted((p for p in root.glob(f"*run-*-{cfg.trainer.run_id}") if p.is_dir()),
                  key=lambda p: p.name.split("run-", 1)[1])  # by start time ("offline-run-" or "run-" + time)
    out: dict[str, Any] = {"wandb_dirs": [str(p) for p in dirs]}
    offline = [p for p in dirs if p.name.startswith("offline-run-")]
    if offline:
        out["wandb_sync"] = "wandb sync " + " ".join(str(p) for p in offline)
    return out
