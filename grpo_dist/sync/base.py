"""Weight sync: how versioned adapter tensors travel from the learner to every rollout worker.

``publish`` runs in the learner process (rank 0) and returns a small, picklable payload;
``receive`` runs in each rollout worker and turns the payload back into an ``AdapterUpdate``.
Whatever the transport, the worker then writes the update with ``AdapterStore`` as a PEFT
adapter directory on local tmpfs and serves it as ``LoRARequest(f"v{version}", version, path)``.
"""

from __future__ import annotations

import abc
import json
import os
import shutil
import tempfile
from pathlib import Path

from grpo_dist.types import AdapterUpdate


class WeightTransport(abc.ABC):
    name: str = "base"

    @abc.abstractmethod
    def publish(self, update: AdapterUpdate) -> object:
        """Learner side: make ``update`` available; return the payload sent to workers."""

    @abc.abstractmethod
    def receive(self, payload: object) -> AdapterUpdate:
        """Worker side: the update the payload stands for."""


def default_tmp_root() -> Path:
    shm = Path("/dev/shm")
    return shm if shm.is_dir() and os.access(shm, os.W_OK) else Path(tempfile.gettempdir())


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
