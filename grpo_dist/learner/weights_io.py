"""The learner's weights and state going out and coming back: the update for the rollout workers,
the PEFT adapter (or full model) on disk, DeepSpeed checkpoints (with the KL reference and this
rank's torch RNG), and the reference refresh.

``WeightsIO`` works on a :class:`~grpo_dist.learner.model.PolicyModel` it is given; the
``Learner`` holds one and hands the public calls to it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from pathlib import Path
from typing import Optional

import torch

from grpo_dist.config import Config
from grpo_dist.types import AdapterUpdate
from grpo_dist.util.files import read_tree, write_tree

from .model import PolicyModel
from .state import barrier, cpu_copies, cpu_tensors, json_safe, strip_prefixes

_STATE_KEY = "grpo_dist_learner"
RNG_DIR = "learner_rng"  # rank r's torch RNG: <checkpoint>/learner_rng/rank<r>.pt


class WeightsIO:
    def __init__(self, cfg: Config, policy: PolicyModel):
        self.cfg, self.policy = cfg, policy
        self.rank, self.world_size = policy.rank, policy.world_size
        self._transport = None  # sync.transport, made on the first publish_update

    # ------------------------------------------------------------------ weights out
    def export_update(self, copy: bool = True) -> Optional[AdapterUpdate]:
        """Current weights for the rollout workers (call on every rank; rank 0 returns them).
        ``copy`` False: the learner's own CPU tensors where they are whole (below ZeRO-3), for a
        caller that is done with them before the next update (a transport's publish)."""
        p = self.policy
        module = p.module
        copies = cpu_copies if copy or self.cfg.learner.zero_stage == 3 else cpu_tensors
        if self.cfg.lora.enabled:
            from peft import get_peft_model_state_dict

            with p.gathered(p.trainable()):
                tensors = copies(get_peft_model_state_dict(module).items()) if self.rank == 0 else None
            peft_config = json_safe(module.peft_config["default"].to_dict())
        else:
            with p.gathered(list(module.parameters())):
                tensors = (copies((strip_prefixes(k), v) for k, v in module.state_dict().items())
                           if self.rank == 0 else None)
            peft_config = None
        if self.rank != 0:
            return None
        return AdapterUpdate(version=p.version, tensors=tensors, peft_config=peft_config)

    def publish_update(self) -> object:
        """``export_update`` handed to the configured transport (``sync.transport``): the
        ``AdapterUpdate`` itself for the object store, a file path for the shared filesystem.
        Call on every rank; rank 0 returns the payload for ``RolloutWorker.load_update``."""
        if self._transport is None:
            from grpo_dist.sync import make_transport

            self._transport = make_transport(self.cfg)
        # published from the learner's own tensors: the object store copies them in as this call
        # returns (zero_copy.ArrayState), the filesystem transport writes them before it returns
        update = self.export_update(copy=False)
        if update is None:
            return None
        return self._transport.publish(update)

    def save_adapter(self, out_dir: str | os.PathLike) -> None:
        """PEFT adapter dir (LoRA) or a full HF model dir + tokenizer; rank 0 writes."""
        p = self.policy
        module = p.module
        params = p.trainable() if self.cfg.lora.enabled else list(module.parameters())
        with p.gathered(params):
            if self.rank == 0:
                Path(out_dir).mkdir(parents=True, exist_ok=True)
                module.save_pretrained(str(out_dir))
                if not self.cfg.lora.enabled:
                    from transformers import AutoTokenizer

                    AutoTokenizer.from_pretrained(self.cfg.model.path).save_pretrained(str(out_dir))
        self._barrier()

    def refresh_reference(self, mix: Optional[float] = None) -> dict[str, float]:
        """Mix the current policy into the KL reference (``algo.ref_refresh_mix`` unless given);
        every rank must call it. The policy and the rollout workers are untouched."""
        p = self.policy
        mix = self.cfg.algo.ref_refresh_mix if mix is None else float(mix)
        p.reference.refresh(p.module, mix, p.gathered)
        return {"train/ref_refreshes": float(p.reference.refreshes), "train/ref_rank": float(p.reference.rank)}

    def _barrier(self) -> None:
        if self.world_size > 1:
            barrier()

    # ------------------------------------------------------------------ checkpoints
    def save_checkpoint(self, ckpt_dir: str | os.PathLike, client_state: Optional[dict] = None) -> None:
        """DeepSpeed checkpoint (trainable weights, optimizer, scheduler, steps) + ``adapter/`` +
        the reference (after a refresh) + every rank's torch RNG. Every rank must call it."""
        p = self.policy
        # DeepSpeed returns its own keys (ds_config, ...) mixed into the client state on load: keep
        # ours under one key.
        state = {_STATE_KEY: {"version": p.version, "client_state": dict(client_state or {})}}
        rng = rng_state(p.device)  # before anything below could draw from it
        p.engine.save_checkpoint(str(ckpt_dir), client_state=state, exclude_frozen_parameters=self.cfg.lora.enabled)
        self.save_adapter(Path(ckpt_dir) / "adapter")
        (Path(ckpt_dir) / RNG_DIR).mkdir(parents=True, exist_ok=True)
        torch.save(rng, Path(ckpt_dir) / RNG_DIR / f"rank{self.rank}.pt")
        if self.rank == 0:
            p.reference.save(ckpt_dir)
        self._barrier()

    def load_checkpoint(self, ckpt_dir: str | os.PathLike) -> dict:
        """Restore a ``save_checkpoint`` directory; returns the client_state given to it. This
        rank's torch RNG comes back too where the checkpoint has it (a checkpoint from before it
        was saved, or from a run with fewer ranks, leaves it as set-up seeded it)."""
        p = self.policy
        path, client = p.engine.load_checkpoint(str(ckpt_dir), load_module_strict=not self.cfg.lora.enabled)
        if path is None:
            raise FileNotFoundError(f"no DeepSpeed checkpoint found in {ckpt_dir}")
        ours = (client or {}).get(_STATE_KEY, {})
        p.version = int(ours.get("version", p.engine.global_steps))
        p.reference.load(ckpt_dir, p.device)
        rng_file = Path(ckpt_dir) / RNG_DIR / f"rank{self.rank}.pt"
        if rng_file.is_file():
            set_rng_state(torch.load(rng_file, map_location="cpu", weights_only=True), p.device)
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
            write_tree(tmp, files, durable=False)  # a scratch copy: no fsync
            return self.load_checkpoint(tmp)

    def adapter_files(self) -> dict[str, bytes]:
        """``save_adapter``'s files (rank 0; {} on the others). Every rank must call it."""
        with _scratch(f"adapter-rank{self.rank}") as tmp:
            self.save_adapter(tmp)
            return read_tree(tmp) if self.rank == 0 else {}


def rng_state(device: torch.device) -> dict[str, torch.Tensor]:
    """torch's CPU generator state, and ``device``'s CUDA generator state when it is a GPU (LoRA
    dropout draws from the generator of the device it runs on)."""
    state = {"cpu": torch.get_rng_state()}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def set_rng_state(state: dict[str, torch.Tensor], device: torch.device) -> None:
    torch.set_rng_state(state["cpu"])
    if device.type == "cuda" and "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"], device)


@contextlib.contextmanager
def _scratch(tag: str):
    path = Path(tempfile.mkdtemp(prefix=f"grpo_dist-{tag}-"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
