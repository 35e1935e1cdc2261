"""The learner: a DeepSpeed engine over the base model + a PEFT LoRA adapter (or all weights).

A plain class (``cluster/`` wraps it as a Ray actor); everything it returns pickles: dataclasses
from ``types.py`` and dicts of floats. One instance per data-parallel rank; each gets its
contiguous shard of the batch (``TrainBatch.shard(rank, world)``).

``Learner`` is the public face and composes the parts, each with a concern of its own:

* ``PolicyModel`` (``model.py``): the engine, the reference and the forward passes, built from the config;
* ``Layout`` (``layout.py``): padded or packed micro-batches, chosen by a check at set-up;
* ``TrainStep`` (``step.py``): the loss over micro-batches, backward, optimizer steps, metrics;
* ``WeightsIO`` (``weights_io.py``): updates for the rollout workers, adapters, checkpoints.

With ``adapters`` (``{name: config}``, issue 53) one rank holds the base once and a set of these
parts per adapter (``adapters.py``); every call that reads or changes an adapter's state takes
``adapter=NAME`` (default: the one last named, the first at set-up).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any, Optional

import torch

from grpo_dist.config import Config
from grpo_dist.devices import torch_threads
from grpo_dist.types import AdapterUpdate, TrainBatch

from . import perf
from .adapters import base_bytes, build_adapters
from .layout import Layout
from .model import PolicyModel
from .step import TrainStep, old_logp_source
from .weight_group import WeightBroadcast
from .weights_io import WeightsIO


@dataclass
class _Slot:
    """One adapter's parts."""
    policy: PolicyModel
    layout: Layout
    step: TrainStep
    io: WeightsIO
    broadcast: WeightBroadcast


class Learner:
    """DeepSpeed + PEFT GRPO learner (one data-parallel rank); ``adapters``: several adapters on
    one base, ``{name: config}`` (``cfg`` is then the first's)."""

    def __init__(self, cfg: Config, rank: int = 0, world_size: int = 1, master_addr: str = "127.0.0.1",
                 master_port: int = 29500, local_rank: Optional[int] = None,
                 adapters: Optional[dict[str, Config]] = None):
        self.cfg = cfg
        self.adapter_cfgs: dict[str, Config] = dict(adapters) if adapters else {"": cfg}
        self._slots: dict[str, _Slot] = {}
        self.adapter = next(iter(self.adapter_cfgs))  # the adapter calls without ``adapter=`` act on
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
        policies = build_adapters(self.adapter_cfgs, self.rank, self.world_size, self.master_addr,
                                  self.master_port, self.local_rank)
        p = next(iter(policies.values()))
        peak, peak_source = perf.peak_flops(p.device, getattr(torch, cfg.model.dtype))
        for name, policy in policies.items():
            self._slots[name] = self._parts(self.adapter_cfgs[name], policy, peak)
        self.use(next(iter(policies)))
        if self.rank == 0:
            print(self.layout.line, flush=True)
            print(f"learner peak for perf/mfu: {peak_source}", flush=True)
        info = {**p.sizes(), "gradient_accumulation_steps": p.gas, "world_size": self.world_size,
                "packing": self.layout.mode, "packed_row_len": self.layout.pack_len, "torch_threads": threads,
                "peak_tflops": peak / 1e12, "peak_source": peak_source,
                "timing/init_distributed": p.timing["timing/init_distributed"],
                "timing/setup": time.perf_counter() - t0}
        if len(policies) > 1:
            info.update(adapters=list(policies), base_bytes=base_bytes(policies))
        return info

    def _parts(self, cfg: Config, p: PolicyModel, peak: float) -> _Slot:
        """An adapter's layout (checked on its own model), training step, weights I/O and broadcast."""
        ref_copy = p.reference.model
        layout = Layout(p.pad_id, p.device, getattr(torch, cfg.model.dtype),
                        models=lambda: [p.module] + ([ref_copy] if ref_copy is not None else []))
        layout.choose(cfg.learner.packing, cfg.learner.pack_max_len, p.module.config, p.logprobs_nograd,
                      self.world_size)
        return _Slot(p, layout, TrainStep(p, layout, peak, self._old_logp_source), WeightsIO(cfg, p),
                     WeightBroadcast(cfg, p, self.rank))  # broadcast: sync.transport collective

    def use(self, adapter: Optional[str]) -> None:
        """Make ``adapter`` the one calls act on (None: keep the current one)."""
        if adapter is None or (adapter == self.adapter and self.policy is not None):
            return
        if adapter not in self._slots:
            raise KeyError(f"learner: no adapter {adapter!r} (it holds {sorted(self._slots)})")
        s = self._slots[adapter]
        self.adapter = adapter
        self.policy, self.layout, self.step, self.io, self.broadcast = s.policy, s.layout, s.step, s.io, s.broadcast

    @property
    def adapters(self) -> list[str]:
        """The adapters' names, in set-up order ("" for a learner of one adapter)."""
        return list(self._slots)

    def _ready(self, adapter: Optional[str] = None) -> PolicyModel:
        if self.policy is None:
            raise RuntimeError("Learner.setup() must be called first")
        self.use(adapter)
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
        for slot in self._slots.values():
            slot.step.old_logp_source = value

    # ------------------------------------------------------------------ training and log-probs
    def train_step(self, batch: TrainBatch, adapter: Optional[str] = None) -> dict[str, float]:
        """``algo.num_iterations`` optimizer steps on this rank's shard; returns ``train/*``,
        ``perf/*`` and ``timing/learn_*`` metrics."""
        self._ready(adapter)
        return self.step.run(batch)

    def compute_logprobs(self, batch: TrainBatch, adapter: Optional[str] = None) -> list[list[float]]:
        """Per-completion-token log-probs under the current adapter (temperature-scaled), no grad."""
        p = self._ready(adapter)
        out: list[list[float]] = []
        mbs = self.cfg.learner.micro_batch_size
        for lo in range(0, len(batch), mbs):
            mb = self.layout.collate(batch, range(lo, min(len(batch), lo + mbs)))
            logp = p.logprobs_nograd(mb).cpu()
            out += [logp[r, :n].tolist() for r, n in enumerate(mb.lengths)]
        return out

    # ------------------------------------------------------------------ weights in and out
    def export_update(self, adapter: Optional[str] = None) -> Optional[AdapterUpdate]:
        """Current weights for the rollout workers (call on every rank; rank 0 returns them)."""
        self._ready(adapter)
        return self.io.export_update()

    def publish_update(self, adapter: Optional[str] = None) -> tuple[int, object]:
        """``export_update`` handed to ``sync.transport``: ``(version, payload)``, the payload
        rank 0's (None on the others). Every rank calls it. The driver asks Ray for the two as two
        return objects: it waits on the small one and hands the payload on unread."""
        self._ready(adapter)
        return self.version, self.io.publish_update()

    def save_adapter(self, out_dir: str | os.PathLike, adapter: Optional[str] = None) -> None:
        """PEFT adapter dir (LoRA) or a full HF model dir + tokenizer; rank 0 writes. Every rank calls it."""
        self._ready(adapter)
        self.io.save_adapter(out_dir)

    def save_checkpoint(self, ckpt_dir: str | os.PathLike, client_state: Optional[dict] = None,
                        adapter: Optional[str] = None) -> None:
        """DeepSpeed checkpoint + adapter + reference + this rank's torch RNG. Every rank calls it."""
        self._ready(adapter)
        self.io.save_checkpoint(ckpt_dir, client_state)

    def load_checkpoint(self, ckpt_dir: str | os.PathLike, adapter: Optional[str] = None) -> dict:
        """Restore a ``save_checkpoint`` directory; returns the client_state given to it."""
        self._ready(adapter)
        return self.io.load_checkpoint(ckpt_dir)

    def checkpoint_files(self, client_state: Optional[dict] = None, adapter: Optional[str] = None) -> dict[str, bytes]:
        """``save_checkpoint`` to a local temp dir; this rank's files (path -> bytes)."""
        self._ready(adapter)
        return self.io.checkpoint_files(client_state)

    def load_checkpoint_files(self, files: dict[str, bytes], adapter: Optional[str] = None) -> dict:
        """``load_checkpoint`` of the merged files of every rank. Every rank calls it."""
        self._ready(adapter)
        return self.io.load_checkpoint_files(files)

    def adapter_files(self, adapter: Optional[str] = None) -> dict[str, bytes]:
        """``save_adapter``'s files (rank 0; {} on the others). Every rank calls it."""
        self._ready(adapter)
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

    def weights_version(self, adapter: Optional[str] = None) -> int:
        """``version`` as a method (a Ray actor's properties cannot be called): the version the
        weights a broadcast sends now carry (after a resume, the restored one)."""
        self.use(adapter)
        return self.version

    def refresh_reference(self, mix: Optional[float] = None, adapter: Optional[str] = None) -> dict[str, float]:
        """Mix the policy into the KL reference (``algo.ref_refresh_mix`` unless given); every rank."""
        self._ready(adapter)
        return self.io.refresh_reference(mix)

    def shutdown(self) -> None:
        """Drop the engine and destroy the process group (through DeepSpeed, which also forgets its
        cached world-group clone, so a later ``setup()`` in this process can initialise again)."""
        import torch.distributed as dist

        self.policy = self.layout = self.step = self.io = None
        self._slots.clear()
        if dist.is_available() and dist.is_initialized():
            import deepspeed.comm

            deepspeed.comm.destroy_process_group()
