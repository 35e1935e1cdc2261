"""The rollout worker's half of ``sync.transport: collective``: its vLLM engine joins the weight
group of learner rank 0 and the other engines, then receives each version and loads it in place.

Two ways into the engine, both through ``collective_rpc``:

* CPU engines (and LoRA): the worker extension ``grpo_dist.rollout.vllm_weight_ext`` (gloo);
* GPUs, full weights: vLLM's own weight-transfer API (``init_weight_transfer_engine``,
  ``start_weight_update`` / ``update_weights`` / ``finish_weight_update``; ``sync/nccl_api.py``).
  Written, not run here.

Mixins of :class:`RolloutWorker` (``cfg``, ``engine``, ``rank``, ``version``, ``_asleep``) and of
its async twin.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Optional

from grpo_dist.rollout.vllm_engine import LOAD_EXTENSION as EXTENSION
from grpo_dist.sync import nccl_api


def weight_group_engine_kwargs(cfg, in_memory: bool = False) -> dict[str, Any]:
    """The vLLM engine arguments ``sync.transport: collective`` needs; for other transports, the
    extension where ``in_memory`` (full or merged weights: loaded in place from the payload,
    ``grpo_load_state`` / ``grpo_load_shared``), else {} (vLLM's LoRA kernels read a directory)."""
    if cfg.sync.transport != "collective":
        return {"worker_extension_cls": EXTENSION} if in_memory else {}
    return nccl_api.engine_kwargs() if nccl_api.uses_nccl(cfg) else {"worker_extension_cls": EXTENSION}


def _node_ip() -> Optional[str]:
    try:
        import ray

        return ray.util.get_node_ip_address() if ray.is_initialized() else None
    except Exception:  # pragma: no cover - outside Ray
        return None


def _on_engine_thread(engine, fn):
    """``fn()`` on the thread the engine belongs to (an in-process vLLM CPU engine has one:
    ``VLLMGenerator.on_engine_thread``; NOTES.md), else here."""
    run = getattr(engine, "on_engine_thread", None)
    return fn() if run is None else run(fn)


def _named(version: Optional[int], seq: int, epoch: int) -> int:
    """The version a broadcast on the NCCL path is served as: the driver's (vLLM's transfer carries
    none; ``CollectiveSync.restore`` asks the learner for its version first)."""
    if version is None:
        raise ValueError(f"weight broadcast {seq} of group {epoch} came with no version: vLLM's NCCL weight "
                         f"transfer carries none, so the driver must name the version it sends "
                         f"(receive_weights(seq, epoch, version))")
    return int(version)


class WeightGroupMember:
    _wg_epoch = 0
    _wg_seq = 0
    _wg_manifest: Optional[dict[str, Any]] = None

    def _wg_rpc_timeout(self) -> float:
        return float(self.cfg.sync.timeout_s) + 30.0

    def _join_rpc(self, host: str, port: int, world_size: int, rank: int, epoch: int,
                  manifest: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        """The collective_rpc that joins the group: (method, kwargs)."""
        self._wg_epoch, self._wg_seq, self._wg_manifest = epoch, 0, manifest
        if nccl_api.uses_nccl(self.cfg):
            return "init_weight_transfer_engine", {"init_info": nccl_api.worker_init_info(
                host, port, rank, world_size, manifest["bucket_bytes"])}
        from grpo_dist.hub import local_model_dir

        model_dir = str(local_model_dir(self.cfg.model.path)) if manifest["kind"] == "lora" else None
        return "grpo_join_weight_group", dict(host=host, port=int(port), world_size=int(world_size), rank=int(rank),
                                              epoch=int(epoch), manifest=manifest, timeout_s=float(self.cfg.sync.timeout_s),
                                              bind_ip=_node_ip(), model_dir=model_dir)

    def join_weight_group(self, host: str, port: int, world_size: int, rank: int, epoch: int,
                          manifest: dict[str, Any]) -> dict[str, Any]:
        """Join learner rank 0's group as ``rank`` (every party joins at the same time)."""
        t0 = time.perf_counter()
        method, kwargs = self._join_rpc(host, port, world_size, rank, epoch, manifest)
        _on_engine_thread(self.engine, lambda: self.engine.llm.collective_rpc(
            method, timeout=self._wg_rpc_timeout(), kwargs=kwargs))
        return {"rank": rank, "epoch": epoch, "seconds": time.perf_counter() - t0}

    def receive_weights(self, seq: int, epoch: int, version: Optional[int] = None) -> dict[str, Any]:
        """Receive broadcast ``seq`` of group ``epoch`` and serve it from now on (``version``: the
        driver's, needed on the NCCL path, whose transfer carries none: without it the engine
        still takes its part of the transfer, so no peer waits, then raises ValueError; the gloo
        path reads the learner's from the broadcast). A colocated engine asleep wakes its weights
        first, its KV cache after."""
        if epoch != self._wg_epoch:  # sent on a group replaced since: the new one re-sends
            return {"version": self.version, "bytes": 0, "seconds": 0.0, "skipped": 1.0}
        t0 = time.perf_counter()
        out = _on_engine_thread(self.engine, lambda: self._receive(seq, epoch, version))
        self._wg_seq = seq
        return self._received(out, t0)

    def _receive(self, seq: int, epoch: int, version: Optional[int]) -> dict[str, Any]:
        """The engine's calls of :meth:`receive_weights`, on the engine's own thread."""
        llm = self.engine.llm
        asleep, self._asleep = self._asleep, False
        if asleep:
            self.engine.wake_up(["weights"])
        if nccl_api.uses_nccl(self.cfg):
            llm.collective_rpc("start_weight_update")
            llm.collective_rpc("update_weights", kwargs={"update_info": nccl_api.update_info(self._wg_manifest)})
            llm.collective_rpc("finish_weight_update")
            out = {"version": _named(version, seq, epoch), "merge_s": 0.0}
        else:
            out = llm.collective_rpc("grpo_receive_weights", timeout=self._wg_rpc_timeout(), kwargs={"seq": seq})[0]
        llm.reset_prefix_cache()
        if asleep:
            self.engine.wake_up(["kv_cache"])
        return out

    def _received(self, out: dict[str, Any], t0: float) -> dict[str, Any]:
        self.version = int(out["version"])
        seconds = time.perf_counter() - t0
        from grpo_dist.sync.buckets import payload_bytes

        return {**out, "version": self.version, "bytes": payload_bytes(self._wg_manifest), "seconds": seconds,
                "write_s": 0.0, "load_s": seconds - out.get("merge_s", 0.0)}


class StreamingWeightGroupMember(WeightGroupMember):
    """The async actor's twin: loads wait for their turn (Ray runs an async actor's calls out of
    order, a broadcast must be entered in order), drain the running groups, then load."""

    _wg_turn: Optional[asyncio.Condition] = None

    def _turns(self) -> asyncio.Condition:
        if self._wg_turn is None:
            self._wg_turn = asyncio.Condition()
        return self._wg_turn

    async def join_weight_group(self, host: str, port: int, world_size: int, rank: int, epoch: int,
                                manifest: dict[str, Any]) -> dict[str, Any]:
        t0 = time.perf_counter()
        method, kwargs = self._join_rpc(host, port, world_size, rank, epoch, manifest)
        await self.engine.llm.collective_rpc(method, timeout=self._wg_rpc_timeout(), kwargs=kwargs)
        async with self._turns():
            self._turns().notify_all()
        return {"rank": rank, "epoch": epoch, "seconds": time.perf_counter() - t0}

    async def receive_weights(self, seq: int, epoch: int, version: Optional[int] = None) -> dict[str, Any]:
        turns = self._turns()
        async with turns:
            await turns.wait_for(lambda: epoch != self._wg_epoch or self._wg_seq == seq - 1)
        if epoch != self._wg_epoch:
            return {"version": self.version, "bytes": 0, "seconds": 0.0, "skipped": 1.0}
        t0 = time.perf_counter()
        llm = self.engine.llm

        async def load() -> dict[str, Any]:
            if nccl_api.uses_nccl(self.cfg):
                await llm.collective_rpc("start_weight_update")
                await llm.collective_rpc("update_weights", kwargs={"update_info": nccl_api.update_info(self._wg_manifest)})
                await llm.collective_rpc("finish_weight_update")
                return {"version": _named(version, seq, epoch), "merge_s": 0.0}
            return (await llm.collective_rpc("grpo_receive_weights", timeout=self._wg_rpc_timeout(),
                                             kwargs={"seq": seq}))[0]

        try:
            async with self._loads():
                out = await self.engine.reload_in_place(load)
        finally:
            async with turns:
                self._wg_seq = max(self._wg_seq, seq)
                turns.notify_all()
        return self._received(out, t0)
