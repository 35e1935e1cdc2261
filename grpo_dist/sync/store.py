"""A rollout worker's disk cache of received weight versions.

After a transport's ``receive``, the worker writes the update here as a PEFT adapter directory
(or a ``model.safetensors`` for full weights) on local tmpfs and serves it as
``LoRARequest(f"v{version}", version, path)``.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

from grpo_dist.sync.base import default_tmp_root
from grpo_dist.types import AdapterUpdate


class AdapterStore:
    """A worker's local copies of received versions: ``<root>/v<version>/``, the newest ``keep`` kept."""

    def __init__(self, root: str | os.PathLike | None = None, keep: int = 2, tag: str = "worker"):
        base = Path(root) if root else default_tmp_root()
        base.mkdir(parents=True, exist_ok=True)
        self.root = Path(tempfile.mkdtemp(prefix=f"grpo_dist-{tag}-", dir=base))
        self.keep = keep
        self.versions: list[int] = []

    def write(self, update: AdapterUpdate) -> Path:
        from safetensors.torch import save_file

        out = self.root / f"v{update.version}"
        tmp = self.root / f".v{update.version}.partial"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        tensors = {k: v.contiguous() for k, v in update.tensors.items()}
        if update.is_lora:
            save_file(tensors, str(tmp / "adapter_model.safetensors"))
            (tmp / "adapter_config.json").write_text(json.dumps(update.peft_config, indent=1))
        else:
            save_file(tensors, str(tmp / "model.safetensors"))
        shutil.rmtree(out, ignore_errors=True)
        tmp.rename(out)  # readers never see a half-written version
        if update.version in self.versions:  # written again (a re-issued load): counts once
            self.versions.remove(update.version)
        self.versions.append(update.version)
        while len(self.versions) > self.keep:
            shutil.rmtree(self.root / f"v{self.versions.pop(0)}", ignore_errors=True)
        return out

    def close(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)
