"""Shared-filesystem transport: the learner writes ``<dir>/v<version>.pt``, workers read it.

For clusters with a shared mount (NFS, Lustre) and very large full-weight updates, where only a
path should cross the object store. ``sync.tmp_dir`` must be visible from every node.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch

from grpo_dist.sync.base import WeightTransport, default_tmp_root
from grpo_dist.types import AdapterUpdate


class FilesystemTransport(WeightTransport):
    name = "filesystem"

    def __init__(self, directory: str | os.PathLike | None = None, keep: int = 2):
        self.dir = Path(directory) if directory else default_tmp_root() / "grpo_dist-sync"
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
        blob = torch.load(str(payload), map_location="cpu", weights_only=True)
        return AdapterUpdate(version=blob["version"], tensors=blob["tensors"], peft_config=json.loads(blob["peft_config"]))
