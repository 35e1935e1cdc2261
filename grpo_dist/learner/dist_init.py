"""Joining DeepSpeed's process group without compiling anything.

DeepSpeed's CPU backend JIT-compiles a C++ shared-memory all-reduce (``deepspeed_shm_comm``) the
first time a process calls ``init_distributed``: a compiler needed on every node, ~45 s on an idle
AVX-512 machine and 2-3 min on a busy 2-core one, once per build directory -- and every checkout
or venv at another path wrote its own flags over the shared build directory and compiled it again
(CI and a session on one machine took turns rebuilding it, each learner that started meanwhile
waiting on the build's lock). The op serves only ``inference_all_reduce`` (DeepSpeed inference and
AutoTP); training's collectives (all-reduce, reduce-scatter, all-gather, broadcast) go through
``torch.distributed`` either way. So it is marked unavailable before the group starts.
"""

from __future__ import annotations

import datetime

SHM_OP = "deepspeed_shm_comm"
# one store per rendezvous in a process: a group destroyed and formed again on the same address (the
# tests' in-process learners) reuses it, as torch's env:// store (multi-tenant) did; its server lives on
_STORES: dict = {}


def skip_shm_op() -> None:
    """Mark DeepSpeed's shared-memory inference all-reduce op unavailable: ``init_distributed``
    then neither compiles nor loads it (its CPU backend falls back to ``torch.distributed``)."""
    import deepspeed.ops

    compatible = getattr(deepspeed.ops, "__compatible_ops__", None)
    if isinstance(compatible, dict):
        compatible[SHM_OP] = False


def init_process_group(backend: str, timeout: datetime.timedelta | None = None) -> None:
    """``deepspeed.init_distributed`` over ``backend`` (RANK ... MASTER_PORT from the environment),
    with nothing compiled. The group is formed first through a store that listens on MASTER_ADDR
    only (``util.ports.tcp_store``; torch's env:// store listens on every interface), with gloo on
    the loopback interface when MASTER_ADDR is a loopback address; DeepSpeed then adopts it."""
    import os

    import deepspeed
    import torch.distributed as dist

    from grpo_dist.util.ports import gloo_on_loopback, tcp_store

    skip_shm_op()
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    addr, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    if backend == "gloo":
        gloo_on_loopback(addr)
    timeout = timeout or dist.default_pg_timeout
    if not dist.is_initialized():
        key = (addr, port, world, rank)
        store = _STORES.get(key) or tcp_store(addr, port, world, rank == 0, timeout)
        _STORES[key] = store
        dist.init_process_group(backend, store=store, rank=rank, world_size=world, timeout=timeout)
    deepspeed.init_distributed(dist_backend=backend, auto_mpi_discovery=False, verbose=False, timeout=timeout)
