"""A vLLM worker extension (``worker_extension_cls``): the engine end of ``sync.transport:
collective`` where vLLM's weight-transfer API has no backend (CPU engines, gloo).

vLLM mixes this class into its worker; the rollout worker calls its methods through
``collective_rpc("grpo_...")``. The worker joins the weight group of learner rank 0 and the other
engines (``grpo_dist.sync.buckets``), receives each version bucket by bucket and loads it in place.

Loading in place on vLLM's CPU build (0.32): the CPU linear method repacks each linear weight
after loading (oneDNN) and leaves the module's ``weight`` an empty ``[0]`` parameter with no
``weight_loader``, so ``model.load_weights(...)`` fails ("Attempted to load weight (torch.Size([128,
256])) into parameter (torch.Size([0]))", or "'Parameter' object has no attribute 'weight_loader'")
and there is nothing to run ``process_weights_after_loading`` on. What works is vLLM's own reload
machinery fed from memory, the same one ``reload_weights`` and the GPU weight-transfer engines use:
``initialize_layerwise_reload(model)`` puts each layer back in its checkpoint format (on the meta
device, loaders wrapped), ``model.load_weights(bucket)`` may then be called once per bucket (a layer
whose weights span two buckets waits for the rest), and each layer complete is materialised,
processed (repacked) and copied into the tensors the engine runs with;
``finalize_layerwise_reload`` puts back the layers nothing was sent for (the rotary cache).
On the tiny test model the engine's log-probs match the HF model's of the loaded weights, with the
weights in one bucket or several (benchmarks/NOTES.md).

LoRA (``rollout.adapter_mode: merged``): the adapter's tensors travel; this worker merges them into
its copy of the base (``LoraMerger``, read once from ``model_dir``) and loads the layers they touch,
each weight merged as the reload takes it. ``grpo_load_state`` is the same load for a state the
rollout actor merged itself (an engine core in its process: no file written and read back).
"""

from __future__ import annotations

import time
from typing import Any, Optional


class WeightGroupExtension:
    _grpo_group = None
    _grpo_manifest: Optional[dict[str, Any]] = None
    _grpo_epoch = 0
    _grpo_seq = 0
    _grpo_merger = None
    _grpo_model_dir: Optional[str] = None

    def grpo_join_weight_group(self, host: str, port: int, world_size: int, rank: int, epoch: int,
                               manifest: dict[str, Any], timeout_s: float, bind_ip: Optional[str] = None,
                               model_dir: Optional[str] = None) -> dict[str, Any]:
        """Join learner rank 0's group as ``rank`` (blocks until every member joined)."""
        from grpo_dist.sync.buckets import WeightGroup

        self.grpo_leave_weight_group()
        t0 = time.perf_counter()
        self._grpo_group = WeightGroup(host, port, rank, world_size, timeout_s, tag=str(epoch), bind_ip=bind_ip)
        self._grpo_manifest, self._grpo_epoch, self._grpo_seq = manifest, epoch, 0
        self._grpo_model_dir = model_dir
        return {"rank": rank, "seconds": time.perf_counter() - t0}

    def grpo_leave_weight_group(self) -> None:
        group, self._grpo_group = self._grpo_group, None
        if group is not None:
            group.close()

    def grpo_receive_weights(self, seq: int) -> dict[str, Any]:
        """Receive broadcast ``seq`` of the group and load it in place; the version it carried,
        the bytes, the seconds (receiving included), the adapter check's seconds (LoRA: each
        weight is merged as the reload takes it, inside the load) and this process's extra peak
        memory."""
        from grpo_dist.sync.buckets import prefetched, receive_header, unpack
        from grpo_dist.util.memory import PeakMemory

        if self._grpo_group is None:
            raise RuntimeError("this engine is in no weight group (grpo_join_weight_group first)")
        group, manifest = self._grpo_group, self._grpo_manifest
        t0 = time.perf_counter()
        try:
            with PeakMemory() as peak:
                epoch, got_seq, version, n = receive_header(group, 4)
                if (epoch, got_seq) != (self._grpo_epoch, seq):
                    raise RuntimeError(f"expected broadcast {seq} of group {self._grpo_epoch}, the learner sent "
                                       f"broadcast {got_seq} of group {epoch}")
                buckets = prefetched(unpack(manifest, group.broadcast))  # bucket k+1 arrives as k loads
                if manifest["kind"] == "lora":
                    tensors = {name: t for done in buckets for name, t in done}
                    t1 = time.perf_counter()
                    merged = self._grpo_merged(tensors, manifest["peft_config"])  # checked, merged as loaded
                    merge_s = time.perf_counter() - t1
                    self._grpo_load([merged])
                else:
                    merge_s = 0.0
                    self._grpo_load(buckets)
        except Exception:
            self.grpo_leave_weight_group()  # unusable after a failed collective: the driver forms a new one
            raise
        self._grpo_seq = seq
        from grpo_dist.sync.buckets import payload_bytes

        return {"version": version, "bytes": payload_bytes(manifest), "seconds": time.perf_counter() - t0,
                "merge_s": merge_s, "peak_extra_bytes": peak.extra, "buckets": n}

    def _grpo_merged(self, tensors, peft_config):
        if self._grpo_merger is None:
            import torch

            from grpo_dist.sync.merge import LoraMerger

            if not self._grpo_model_dir:
                raise RuntimeError("merging a LoRA adapter needs the base model's directory (model_dir)")
            dtype = self.vllm_config.model_config.dtype
            self._grpo_merger = LoraMerger.shared(self._grpo_model_dir, dtype if isinstance(dtype, torch.dtype) else None)
        return self._grpo_merger.iter_merged(tensors, peft_config, partial=True)

    def grpo_load_state(self, tensors) -> None:
        """Load ``(name, tensor)`` pairs in place, taken one at a time (an iterator: a merged
        version straight from ``LoraMerger.iter_merged``). Reached without copies only from this
        process (an engine core in the rollout actor's process); from another process the
        pairs would be serialised."""
        self._grpo_load([tensors])

    def grpo_load_shared(self, handles) -> None:
        """``grpo_load_state`` from another process of this machine: ``(name, handle)`` pairs of
        ``sync.zero_copy.share`` (CUDA IPC on GPUs, shared-memory files on CPU), read in place."""
        from grpo_dist.sync.zero_copy import rebuild

        self._grpo_load([rebuild(handles)])

    def _grpo_load(self, buckets) -> None:
        """One layerwise reload session over every bucket (see the module's docstring)."""
        from vllm.config import set_current_vllm_config
        from vllm.model_executor.model_loader.reload import finalize_layerwise_reload, initialize_layerwise_reload

        model = self.model_runner.get_model()
        with set_current_vllm_config(self.vllm_config):
            initialize_layerwise_reload(model)
            try:
                for tensors in buckets:
                    if tensors:
                        model.load_weights(iter(tensors))
            finally:  # also after a failure: every layer gets real tensors back (the next load overwrites them)
                finalize_layerwise_reload(model, self.vllm_config.model_config)
        for reset in ("reset_lora_state", "reset_encoder_cache", "reset_mm_cache"):  # what reload_weights resets
            fn = getattr(self.model_runner, reset, None)
            if callable(fn):
                fn()
