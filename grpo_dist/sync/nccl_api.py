"""The GPU path of ``sync.transport: collective``: vLLM's own weight-transfer API over NCCL.

Written against vLLM's source, never run here (no GPU with vLLM, Ray and two devices was available
when it was built; NCCL also refuses two ranks on one device, so it needs the engines on GPUs of
their own: ``cluster.layout: disaggregated``). Two generations of the API are handled:

* ``v1`` (vLLM 0.16 .. ~0.2x, so 0.26): the trainer side is static methods,
  ``NCCLWeightTransferEngine.trainer_init(dict)`` -> communicator and
  ``NCCLWeightTransferEngine.trainer_send_weights(iterator, dict(group=, packed=, ...))``; the
  packing parameters ride each ``update_weights`` request.
* ``v2`` (vLLM 0.32): ``nccl_common.trainer_init`` + ``packed_nccl_broadcast_producer``; the packing
  parameters ride the worker's init info once.

The engine side is the same four worker methods in both, reached through ``collective_rpc``:
``init_weight_transfer_engine(init_info)``, then per version ``start_weight_update()``,
``update_weights(update_info)``, ``finish_weight_update()``; the engine is started with
``weight_transfer_config={"backend": "nccl"}``. One buffer (``packed_num_buffers=1``), so the
learner's extra GPU memory stays at one bucket (vLLM's default double-buffers).
"""

from __future__ import annotations

from typing import Any, Iterator

import torch

NUM_BUFFERS = 1


def api_version() -> str:
    from vllm.distributed.weight_transfer import nccl_engine

    return "v2" if hasattr(nccl_engine, "NCCLTrainerWeightTransferEngine") else "v1"


def engine_kwargs() -> dict[str, Any]:
    """The vLLM engine arguments that make its workers weight-transfer receivers."""
    return {"weight_transfer_config": {"backend": "nccl"}}


def trainer_group(host: str, port: int, world_size: int):
    """Learner rank 0's end of the group (rank 0); every engine must join at the same time."""
    info = {"master_address": host, "master_port": int(port), "world_size": int(world_size)}
    if api_version() == "v2":
        from vllm.distributed.weight_transfer.nccl_common import trainer_init

        return trainer_init(info)
    from vllm.distributed.weight_transfer.nccl_engine import NCCLWeightTransferEngine

    return NCCLWeightTransferEngine.trainer_init(info)


def worker_init_info(host: str, port: int, rank_offset: int, world_size: int, bucket_bytes: int) -> dict[str, Any]:
    """``init_weight_transfer_engine``'s argument for one engine (TP 1: its one worker at ``rank_offset``)."""
    info: dict[str, Any] = {"master_address": host, "master_port": int(port), "rank_offset": int(rank_offset),
                            "world_size": int(world_size)}
    if api_version() == "v2":
        info.update(packed=True, packed_buffer_size_bytes=int(bucket_bytes), packed_num_buffers=NUM_BUFFERS)
    return info


def update_info(manifest: dict[str, Any]) -> dict[str, Any]:
    """``update_weights``' argument: what the learner is about to send."""
    entries = manifest["entries"]
    info: dict[str, Any] = {"names": [e[0] for e in entries], "dtype_names": [e[1] for e in entries],
                            "shapes": [list(e[2]) for e in entries]}
    if api_version() == "v1":
        info.update(packed=True, packed_buffer_size_bytes=int(manifest["bucket_bytes"]),
                    packed_num_buffers=NUM_BUFFERS)
    return info


def send(group, named: Iterator[tuple[str, torch.Tensor]], bucket_bytes: int) -> None:
    """Broadcast ``named`` (CUDA tensors, in manifest order and dtype) in vLLM's packed layout."""
    if api_version() == "v2":
        from vllm.distributed.weight_transfer.packed_tensor import packed_nccl_broadcast_producer

        packed_nccl_broadcast_producer(iterator=named, group=group, src=0, post_iter_func=lambda item: item[1],
                                       buffer_size_bytes=int(bucket_bytes), num_buffers=NUM_BUFFERS)
        return
    from vllm.distributed.weight_transfer.nccl_engine import NCCLWeightTransferEngine

    NCCLWeightTransferEngine.trainer_send_weights(named, {"group": group, "packed": True,
                                                          "packed_buffer_size_bytes": int(bucket_bytes),
                                                          "packed_num_buffers": NUM_BUFFERS})


def close(group) -> None:
    destroy = getattr(group, "destroy", None)
    if callable(destroy):
        try:
            destroy()
        except Exception:  # pragma: no cover - best effort
            pass


def uses_nccl(cfg) -> bool:
    """Whether ``sync.transport: collective`` goes through vLLM's NCCL weight transfer: full
    weights, engines and learner on GPUs (else the gloo group and the worker extension), unless
    ``sync.collective_backend`` says gloo."""
    if getattr(cfg.sync, "collective_backend", "auto") == "gloo":
        return False
    return not cfg.lora.enabled and cfg.cluster.rollout_gpus > 0 and cfg.cluster.learner_gpus > 0
