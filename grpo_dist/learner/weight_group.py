"""The learner's half of ``sync.transport: collective``: rank 0 broadcasts the weights in buckets
over a process group it shares with every rollout engine (``grpo_dist.sync.buckets``; on GPUs
vLLM's NCCL weight transfer, ``grpo_dist.sync.nccl_api``).

Composed into :class:`grpo_dist.learner.Learner` over its :class:`~grpo_dist.learner.model.PolicyModel`.
Every method is called on every learner rank (ZeRO-3 gathers the partitioned weights in a
collective of the learner ranks); only rank 0 is in the weight group and answers.
"""

from __future__ import annotations

import time
from typing import Any, Optional

import torch

from grpo_dist.devices import engine_dtype
from grpo_dist.sync.buckets import WeightGroup, make_manifest, pack, payload_bytes, plan, send_header
from grpo_dist.util.memory import PeakMemory

from .state import json_safe, strip_prefixes


class WeightBroadcast:
    def __init__(self, cfg, policy, rank: int):
        self.cfg, self.policy, self.rank = cfg, policy, rank
        self._wgroup: Any = None  # WeightGroup (gloo) or vLLM's NCCL communicator
        self._wg_nccl = False
        self._wg_epoch = 0
        self._wg_manifest: Optional[dict[str, Any]] = None

    def _sync_params(self) -> list[torch.nn.Parameter]:
        return self.policy.trainable() if self.cfg.lora.enabled else list(self.policy.engine.module.parameters())

    def _sync_named(self) -> list[tuple[str, torch.Tensor]]:
        """What the engines load, in a fixed order: the PEFT adapter state (LoRA) or the model's
        state dict (HF names), a tensor shared under two names (tied embeddings) sent once."""
        module = self.policy.engine.module
        if self.cfg.lora.enabled:
            from peft import get_peft_model_state_dict

            items = list(get_peft_model_state_dict(module).items())
        else:
            items = [(strip_prefixes(k), v) for k, v in module.state_dict().items()]
        seen, out = set(), []
        for name, t in items:
            key = (t.data_ptr(), tuple(t.shape), t.dtype)
            if t.numel() and key in seen:
                continue
            seen.add(key)
            out.append((name, t))
        return out

    def weight_manifest(self) -> Optional[dict[str, Any]]:
        """The tensors every broadcast carries (names, dtypes they travel in, shapes) and the
        bucket size; rank 0 answers, the others None."""
        cfg = self.cfg
        with self.policy.gathered(self._sync_params()):
            if self.rank != 0:
                return None
            lora = cfg.lora.enabled
            peft = json_safe(self.policy.engine.module.peft_config["default"].to_dict()) if lora else None
            send_dtype = None if lora else getattr(torch, engine_dtype(cfg)[0])
            self._wg_manifest = make_manifest(self._sync_named(), kind="lora" if lora else "full",
                                              bucket_bytes=int(cfg.sync.bucket_mb * 2**20), send_dtype=send_dtype,
                                              peft_config=peft)
        return self._wg_manifest

    def join_weight_group(self, host: str, port: int, world_size: int, epoch: int, nccl: bool = False) -> dict:
        """Rank 0 opens the group at ``host:port`` as its rank 0 (the engines join at the same time)."""
        if self.rank != 0:
            return {}
        self.leave_weight_group()
        t0 = time.perf_counter()
        if nccl:
            from grpo_dist.sync import nccl_api

            self._wgroup = nccl_api.trainer_group(host, port, world_size)
        else:
            self._wgroup = WeightGroup(host, port, 0, world_size, self.cfg.sync.timeout_s, tag=str(epoch), bind_ip=host)
        self._wg_nccl, self._wg_epoch = nccl, epoch
        return {"epoch": epoch, "seconds": time.perf_counter() - t0}

    def leave_weight_group(self) -> None:
        group, self._wgroup = self._wgroup, None
        if group is None:
            return
        if self._wg_nccl:
            from grpo_dist.sync import nccl_api

            nccl_api.close(group)
        else:
            group.close()

    def broadcast_weights(self, seq: int) -> dict[str, Any]:
        """Send the current weights to every engine of the group (``seq``: the driver's count of
        broadcasts on this group, checked by the engines). Rank 0's answer: the version sent, the
        bytes, the seconds, the extra peak memory it took (``peak_extra_bytes``) and the buckets."""
        with self.policy.gathered(self._sync_params()):
            if self.rank != 0:
                return {}
            if self._wgroup is None or self._wg_manifest is None:
                raise RuntimeError("learner rank 0 is in no weight group (join_weight_group first)")
            manifest, version = self._wg_manifest, self.policy.version
            named = self._sync_named()
            got = [[n, list(t.shape)] for n, t in named]
            if got != [[e[0], list(e[2])] for e in manifest["entries"]]:
                raise RuntimeError("the learner's weights no longer match the weight group's manifest")
            t0 = time.perf_counter()
            try:
                with PeakMemory(cuda=self.policy.device.type == "cuda") as peak:
                    n = self._send(manifest, named, seq, version)
            except Exception as e:
                self.leave_weight_group()  # unusable after a failed collective: the driver forms a new one
                msg = str(e).strip().splitlines()[0] if str(e).strip() else ""
                raise RuntimeError(f"weight broadcast of version {version} failed (group {self._wg_epoch}, "
                                   f"broadcast {seq}): {type(e).__name__}: {msg}") from None
        return {"version": version, "bytes": payload_bytes(manifest), "seconds": time.perf_counter() - t0,
                "peak_extra_bytes": peak.extra, "buckets": n, "epoch": self._wg_epoch, "seq": seq}

    def _send(self, manifest: dict[str, Any], named: list[tuple[str, torch.Tensor]], seq: int, version: int) -> int:
        if self._wg_nccl:  # vLLM's packed layout, cast to the engine's dtype one tensor at a time
            from grpo_dist.sync import nccl_api
            from grpo_dist.sync.buckets import dtype_of

            dtypes = [dtype_of(e[1]) for e in manifest["entries"]]
            nccl_api.send(self._wgroup, ((n, t.detach().to(dt)) for (n, t), dt in zip(named, dtypes)),
                          manifest["bucket_bytes"])
            return -1
        buckets = plan(manifest)
        send_header(self._wgroup, [self._wg_epoch, seq, version, len(buckets)])
        for b in pack(manifest, [t for _, t in named]):
            self._wgroup.broadcast(b)
        return len(buckets)
