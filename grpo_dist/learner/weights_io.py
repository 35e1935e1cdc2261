"""The learner's weights and state going out and coming back: the update for the rollout workers,
the PEFT adapter (or full model) on disk, and DeepSpeed checkpoints (with the KL reference).

A mixin of :class:`grpo_dist.learner.Learner`: it uses the learner's ``cfg``, ``engine``, ``rank``,
``world_size``, ``_version``, ``reference`` and ``_trainable()``.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from pathlib import Path
from typing import Optional

import torch

from grpo_dist.types import AdapterUpdate

from .state import barrier, cpu_copies, json_safe, strip_prefixes

_STATE_KEY = "grpo_dist_learner"


class WeightsIO:
    # ------------------------------------------------------------------ weights out
    def _gathered(self, params: list[torch.nn.Parameter]):
        if self.cfg.learner.zero_stage == 3:
            import deepspeed

            return deepspeed.zero.GatheredParameters(params, modifier_rank=None)
        return contextlib.nullcontext()

    def export_update(self) -> Optional[AdapterUpdate]:
        """Current weights for the rollout workers (call on every rank; rank 0 returns them)."""
        self._require_setup()
        module = self.engine.module
        if self.cfg.lora.enabled:
            from peft import get_peft_model_state_dict

            with self._gathered(self._trainable()):
                tensors = cpu_copies(get_peft_model_state_dict(module).items()) if self.rank == 0 else None
            peft_config = json_safe(module.peft_config["default"].to_dict())
        else:
            with self._gathered(list(module.parameters())):
                tensors = (cpu_copies((strip_prefixes(k), v) for k, v in module.state_dict().items())
                           if self.rank == 0 else None)
            peft_config = None
        if self.rank != 0:
            return None
        return AdapterUpdate(version=self._version, tensors=tensors, peft_config=peft_config)

    def publish_update(self) -> object:
        """``export_update`` handed to the configured transport (``sync.transport``): the
        ``AdapterUpdate`` itself for the object store, a file path for the shared filesystem.
        Call on every rank; rank 0 returns the payload for ``RolloutWorker.load_update``."""
        update = self.export_update()
        if update is None:
            return None
        if self._transport is None:
            from grpo_dist.sync import make_transport

            self._transport = make_transport(self.cfg)
        return self._transport.publish(update)

    def save_adapter(self, out_dir: str | os.PathLike) -> None:
        """PEFT adapter dir (LoRA) or a full HF model dir + tokenizer; rank 0 writes."""
        self._require_setup()
        module = self.engine.module
        params = self._trainable() if self.cfg.lora.enabled else list(module.parameters())
        with self._gathered(params):
            if self.rank == 0:
                Path(out_dir).mkdir(parents=True, exist_ok=True)
                module.save_pretrained(str(out_dir))
                if not self.cfg.lora.enabled:
                    from transformers import AutoTokenizer

                    AutoTokenizer.from_pretrained(self.cfg.model.path).save_pretrained(str(out_dir))
        self._barrier()

    def _barrier(self) -> None:
        if self.world_size > 1:
            barrier()

    # ------------------------------------------------------------------ checkpoints
    def save_checkpoint(self, ckpt_dir: str | os.PathLike, client_state: Optional[dict] = None) -> None:
        """DeepSpeed checkpoint (trainable weights, optimizer, scheduler, steps) + ``adapter/``.
        Every rank must call it."""
        self._require_setup()
        # DeepSpeed returns its own keys (ds_config, ...) mixed into the client state on load: keep
        # ours under one key.
        state = {_STATE_KEY: {"version": self._version, "client_state": dict(client_state or {})}}
        self.engine.save_checkpoint(str(ckpt_dir), client_state=state,
                                    exclude_frozen_parameters=self.cfg.lora.enabled)
        self.save_adapter(Path(ckpt_dir) / "adapter")
        if self.rank == 0:
            self.reference.save(ckpt_dir)
        self._barrier()

    def load_checkpoint(self, ckpt_dir: str | os.PathLike) -> dict:
        """Restore a ``save_checkpoint`` directory; returns the client_state given to it."""
        self._require_setup()
        path, client = self.engine.load_checkpoint(str(ckpt_dir), load_module_strict=not self.cfg.lora.enabled)
        if path is None:
            raise FileNotFoundError(f"no DeepSpeed checkpoint found in {ckpt_dir}")
        ours = (client or {}).get(_STATE_KEY, {})
        self._version = int(ours.get("version", self.engine.global_steps))
        self.reference.load(ckpt_dir, self.device)
        return dict(ours.get("client_state", {}))

    # ------------------------------------------------------------------ the same, shipped to the driver
    # A rank may run on any node: it writes into a node-local temp dir and returns the files it
    # wrote (relative path -> bytes); the driver merges the ranks' files into its output_dir. LoRA
    # states are small; full-weight training on several nodes writes to cluster.shared_dir instead.
    def checkpoint_files(self, client_state: Optional[dict] = None) -> dict[str, bytes]:
        """``save_checkpoint`` to a local temp dir; this rank's files. Every rank must call it."""
        with _scratch(f"ckpt-rank{self.rank}") as tmp:
            self.save_checkpoint(tmp, client_state)
            return read_tree(tmp)

    def load_checkpoint_files(self, files: dict[str, bytes]) -> dict:
        """``load_checkpoint`` of the merged files of every rank. Every rank must call it."""
        with _scratch(f"load-rank{self.rank}") as tmp:
            write_tree(tmp, files)
            return self.load_checkpoint(tmp)

    def adapter_files(self) -> dict[str, bytes]:
        """``save_adapter``'s files (rank 0; {} on the others). Every rank must call it."""
        with _scratch(f"adapter-rank{self.rank}") as tmp:
            self.save_adapter(tmp)
            return read_tree(tmp) if self.rank == 0 else {}


@contextlib.contextmanager
def _scratch(tag: str):
    path = Path(tempfile.mkdtemp(prefix=f"grpo_dist-{tag}-"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def read_tree(root: str | os.PathLike) -> dict[str, bytes]:
    """Every file under ``root``: relative POSIX path -> bytes."""
    root = Path(root)
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def write_tree(root: str | os.PathLike, files: dict[str, bytes]) -> None:
    """Write ``read_tree``'s mapping under ``root`` (refusing paths that leave it)."""
    root = Path(root).resolve()
    for rel, data in files.items():
        out = (root / rel).resolve()
        if root not in out.parents:
            raise ValueError(f"refusing to write {rel!r} outside {root}")
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_bytes(data)
