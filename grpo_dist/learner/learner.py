"""The learner: a DeepSpeed engine over the base model + a PEFT LoRA adapter (or all weights).

A plain class (``cluster/`` wraps it as a Ray actor); everything it returns pickles: dataclasses
from ``types.py`` and dicts of floats. One instance per data-parallel rank; each gets its
contiguous shard of the batch (``TrainBatch.shard(rank, world)``).

``Learner`` is the public face and composes the parts, each with a concern of its own:

* ``PolicyModel`` (``model.py``): the engine, the reference and the forward passes, built from the config;
* ``Layout`` (``layout.py``): padded or packed micro-batches, chosen by a check at set-up;
* ``TrainStep`` (``step.py``): the loss over micro-batches, backward, optimizer steps, metrics;
* ``WeightsIO`` (``weights_io.py``): updates for the rollout workers, adapters, checkpoints.
"""

from __future__ import annotations

import os
import time
from typing import Any, Optional

import torch

from grpo_dist.config import Config
from grpo_dist.devices import torch_threads
from grpo_dist.types import AdapterUpdate, TrainBatch

from . import perf
from .layout import Layout
from .model import PolicyModel
from .step import TrainStep, old_logp_source
from .weight_group import WeightBroadcast
from .weights_io import WeightsIO


class Learner:
    """DeepSpeed + PEFT GRPO learner (one data-parallel rank)."""

    def __init__(self, cfg: Config, rank: int = 0, world_size: int = 1, master_addr: str = "127.0.0.1",
                 master_port: int = 29500, local_rank: Optional[int] = None):
        self.cfg = cfg
        self.rank, self.world_size = int(rank), int(world_size)
        self.master_addr, self.master_port = master_addr, int(master_port)
        self.local_rank = local_rank
        self.policy: Optional[PolicyModel] = None
        self.layout: Optional[Layout] = None
        self.step: Optional[TrainStep] = None
        self.io: Optional[WeightsIO] = None
        self._old_logp_source = old_logp_source(cfg)

    # ------------------------------------------------------------------ setup
    def setup(self, master_addr: Optional[str] = None, master_port: Optional[int] = None,
              peers_on_node: int = 1) -> dict[str, Any]:
        """Join the process group at ``master_addr:master_port`` (default: the constructor's),
        take ``cluster.torch_threads`` torch threads (``auto``: with ``peers_on_node`` learner
        ranks on this node; see ``grpo_dist.devices.torch_threads``), build the model, choose the
        micro-batch layout and the FLOP/s peak of ``perf/mfu``."""
        if master_addr is not None:
            self.master_addr, self.master_port = master_addr, int(master_port)
        cfg = self.cfg
        threads, why = torch_threads(cfg, "learner", peers_on_node)
        torch.set_num_threads(threads)
        if self.rank == 0:
            print(f"learner torch threads: {threads} ({why})", flush=True)
        t0 = time.perf_counter()
        p = self.policy = PolicyModel.build(cfg, self.rank, self.world_size, self.master_addr, self.master_port,
                                            self.local_rank)
        ref_copy = p.reference.model
        self.layout = Layout(p.pad_id, p.device, getattr(torch, cfg.model.dtype),
                             models=lambda: [p.module] + ([ref_copy] if ref_copy is not None else []))
        self.layout.choose(cfg.learner.packing, cfg.learner.pack_max_len, p.module.config, p.logprobs_nograd,
                           self.world_size)
        peak, peak_source = perf.peak_flops(p.device, getattr(torch, cfg.model.dtype))
        self.step = TrainStep(p, self.layout, peak, self._old_logp_source)
        self.io = WeightsIO(cfg, p)
        self.broadcast = WeightBroadcast(cfg, p, self.rank)  # sync.transport: collective
        if self.rank == 0:
            print(self.layout.line, flush=True)
            print(f"learner peak for perf/mfu: {peak_source}", flush=True)
        return {**p.sizes(), "gradient_accumulation_steps": p.gas, "world_size": self.world_size,
                "packing": self.layout.mode, "packed_row_len": self.layout.pack_len, "torch_threads": threads,
                "peak_tflops": peak / 1e12, "peak_source": peak_source,
                "timing/init_distributed": p.timing["timing/init_distributed"],
                "timing/setup": time.perf_counter() - t0}

    def _ready(self) -> PolicyModel:
        if self.policy is None:
            raise RuntimeError("Learner.setup() must be called first")
        return self.policy

    # ------------------------------------------------------------------ state others read
    @property
    def version(self) -> int:
        """Optimizer steps applied so far (0 = the initial adapter)."""
        return self.policy.version if self.policy is not None else 0

    @property
    def engine(self):
        """The DeepSpeed engine (None before ``setup``)."""
        return self.policy.engine if self.policy is not None else None

    @property
    def reference(self):
        return self.policy.reference if self.policy is not None else None

    @property
    def device(self) -> torch.device:
        return self.policy.device if self.policy is not None else torch.device("cpu")

    @property
    def old_logp_source(self) -> str:
        """``"policy"`` or ``"behaviour"``: where pi_old comes from (``step.old_logp_source``)."""
        return self.step.old_logp_source if self.step is not None else self._old_logp_source

    @old_logp_source.setter
    def old_logp_source(self, value: str) -> None:
        self._old_logp_source = value
        if self.step is not None:
            self.step.old_logp_source = value

    # ------------------------------------------------------------------ training and log-probs
    def train_step(self, batch: TrainBatch) -> dict[str, float]:
        """``algo.num_iterations`` optimizer steps on this rank's shard; returns ``train/*``,
        ``perf/*`` and ``timing/learn_*`` metrics."""
        self._ready()
        return self.step.run(batch)

    def compute_logprobs(self, batch: TrainBatch) -> list[list[float]]:
        """Per-completion-token log-probs under the current adapter (temperature-scaled), no grad."""
        p = self._ready()
        out: list[list[float]] = []
        mbs = self.cfg.learner.micro_batch_size
        for lo in range(0, len(batch), mbs):
            mb = self.layout.collate(batch, range(lo, min(len(batch), lo + mbs)))
            logp = p.logprobs_nograd(mb).cpu()
            out += [logp[r, :n].tolist() for r, n in enumerate(mb.lengths)]
        return out

    # ------------------------------------------------------------------ weights in and out
    def export_update(self) -> Optional[AdapterUpdate]:
        """Current weights for the rollout workers (call on every rank; rank 0 returns them)."""
        self._ready()
        return self.io.export_update()

    def publish_update(self) -> tuple[int, object]:
        """``export_update`` handed to ``sync.transport``: ``(version, payload)``, the payload
        rank 0's (None on the others). Every rank calls it. The driver asks Ray for the two as two
        return objects: it waits on the small one and hands the payload on unread."""
        self._ready()
        return self.version, self.io.publish_update()

    def save_adapter(self, out_dir: str | os.PathLike) -> None:
        """PEFT adapter dir (LoRA) or a full HF model dir + tokenizer; rank 0 writes. Every rank calls it."""
        self._ready()
        self.io.save_adapter(out_dir)

    def save_checkpoint(self, ckpt_dir: str | os.PathLike, client_state: Optional[dict] = None) -> None:
        """DeepSpeed checkpoint + adapter + reference + this rank's torch RNG. Every rank calls it."""
        self._ready()
        self.io.save_checkpoint(ckpt_dir, client_state)

    def load_checkpoint(self, ckpt_dir: str | os.PathLike) -> dict:
        """Restore a ``save_checkpoint`` directory; returns the client_state given to it."""
        self._ready()
        return self.io.load_checkpoint(ckpt_dir)

    def checkpoint_files(self, client_state: Optional[dict] = None) -> dict[str, bytes]:
        """``save_checkpoint`` to a local temp dir; this rank's files (path -> bytes)."""
        self._ready()
        return self.io.checkpoint_files(client_state)

    def load_checkpoint_files(self, files: dict[str, bytes]) -> dict:
        """``load_checkpoint`` of the merged files of every rank. Every rank calls it."""
        self._ready()
        return self.io.load_checkpoint_files(files)

    def adapter_files(self) -> dict[str, bytes]:
        """``save_adapter``'s files (rank 0; {} on the others). Every rank calls it."""
        self._ready()
        return self.io.adapter_files()

    # ------------------------------------------------------------------ sync.transport: collective
    def weight_manifest(self) -> Optional[dict[str, Any]]:
        return self.broadcast.weight_manifest()

    def join_weight_group(self, host: str, port: int, world_size: int, epoch: int, nccl: bool = False) -> dict:
        return self.broadcast.join_weight_group(host, port, world_size, epoch, nccl)

    def leave_weight_group(self) -> None:
        if getattr(self, "broadcast", None) is not None:
            self.broadcast.leave_weight_group()

    def broadcast_weights(self, seq: int) -> dict[str, Any]:
        return self.broadcast.broadcast_weights(seq)

    def weights_version(self) -> int:
        """``version`` as a method (a Ray actor's properties cannot be called): the version the
        weights a broadcast sends now carry (after a resume, the restored one)."""
        return self.version

    def refresh_reference(self, mix: Optional[float] = None) -> dict[str, float]:
        """Mix the policy into the KL reference (``algo.ref_refresh_mix`` unless given); every rank."""
        self._ready()
        return self.io.refresh_reference(mix)

    def shutdown(self) -> None:
        """Drop the engine and destroy the process group (through DeepSpeed, which also forgets its
        cached world-group clone, so a later ``setup()`` in this process can initialise again)."""
        import torch.distributed as dist

        self.policy = self.layout = self.step = self.io = None
        if dist.is_available() and dist.is_initialized():
            import deepspeed.comm

            deepspeed.comm.destroy_process_group()
