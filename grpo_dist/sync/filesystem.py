"""Shared-filesystem transport: the learner writes ``<dir>/v<version>.pt``, workers read it.

For clusters with a shared mount (NFS, Lustre) and very large full-weight updates, where only a
path should cross the object store. The directory is ``<cluster.shared_dir>/<run_id>/sync``:
every node sees it (checked at start) and two runs never share it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch

from grpo_dist.sync.base import WeightTransport
from grpo_dist.types import AdapterUpdate


class FilesystemTransport(WeightTransport):
    name = "filesystem"

    def __init__(self, directory: str | os.PathLike, keep: int = 2):
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.keep = keep

    def publish(self, update: AdapterUpdate) -> str:
        path = self.dir / f"v{update.version}.pt"
        tmp = path.with_suffix(".partial")
        # the config travels as JSON so the file loads with torch.load(weights_only=True)
        torch.save({"version": update.version, "tensors": update.tensors,
                    "peft_config": json.dumps(update.peft_config)}, tmp)
        os.replace(tmp, path)
        for old in sorted(self.dir.glob("v*.pt"), key=lambda p: int(p.stem[1:]))[: -self.keep]:
            old.unlink(missing_ok=True)
        return str(path)

    def receive(self, payload: object) -> AdapterUpdate:
        # mapped, not read: the engine's in-place load reads the page cache straight into its weights
        blob = torch.load(str(payload), map_location="cpu", weights_only=True, mmap=True)
        return AdapterUpdate(version=blob["version"], tensors=blob["tensors"], peft_config=json.loads(blob["peft_config"]))
