"""Weights in buckets over a process group of their own (``sync.transport: collective``).

Both ends compute the same plan from one *manifest* (the tensors' names, dtypes and shapes, sent
once when the group forms): tensors packed back to back (64-byte aligned) into flat byte buckets
of at most ``bucket_bytes``; a tensor larger than a bucket travels alone, in bucket-sized slices.
One broadcast per bucket, never one per parameter.

* The learner (:func:`pack`) copies each bucket's tensors into one reused buffer, cast to the dtype
  they travel in (the engine's), or sends a slice of a large tensor straight from its own memory:
  its extra memory is at most one bucket.
* The engine (:func:`unpack`) receives each bucket into a fresh buffer and hands out views of it
  (vLLM's layerwise reload keeps the views of a layer until the layer is complete, so a buffer is
  never reused); a sliced tensor is received straight into its own tensor.

:class:`WeightGroup` is the group: a TCPStore at learner rank 0's address and a gloo process group
made from it directly, so torch.distributed's default group (DeepSpeed's on the learner, vLLM's
own in the engine) is left alone. Every collective has the group's timeout: a peer that died or
hangs becomes an error, never a hang.
"""

from __future__ import annotations

import datetime
from typing import Any, Callable, Iterable, Iterator, Optional

import torch

ALIGN = 64
Piece = tuple[int, int, int, int]  # (entry index, first element, element count, byte offset in the bucket)
Bucket = tuple[int, list[Piece]]  # (bytes, pieces)


def dtype_of(name: str) -> torch.dtype:
    dt = getattr(torch, name, None)
    if not isinstance(dt, torch.dtype):
        raise ValueError(f"not a torch dtype: {name!r}")
    return dt


def _itemsize(name: str) -> int:
    return torch.empty((), dtype=dtype_of(name)).element_size()


def _numel(shape: Iterable[int]) -> int:
    n = 1
    for s in shape:
        n *= int(s)
    return n


def make_manifest(named: Iterable[tuple[str, torch.Tensor]], *, kind: str, bucket_bytes: int,
                  send_dtype: Optional[torch.dtype] = None, peft_config: Optional[dict] = None) -> dict[str, Any]:
    """What travels, in order (plain lists: it crosses Ray and vLLM's RPC). Floating tensors travel
    in ``send_dtype`` (the engine's weights dtype; None: as they are)."""
    entries = []
    for name, t in named:
        dt = send_dtype if send_dtype is not None and t.is_floating_point() else t.dtype
        entries.append([name, str(dt).removeprefix("torch."), [int(s) for s in t.shape]])
    return {"kind": kind, "peft_config": peft_config, "entries": entries, "bucket_bytes": int(bucket_bytes)}


def plan(manifest: dict[str, Any]) -> list[Bucket]:
    """The buckets of ``manifest``, in the order they travel."""
    cap = int(manifest["bucket_bytes"])
    buckets: list[Bucket] = []
    pieces: list[Piece] = []
    used = 0
    for i, (_, dt, shape) in enumerate(manifest["entries"]):
        size, n = _itemsize(dt), _numel(shape)
        if n * size > cap:  # alone, in slices of at most one bucket
            if pieces:
                buckets.append((used, pieces))
                pieces, used = [], 0
            per = max(1, cap // size)
            buckets += [(min(per, n - s) * size, [(i, s, min(per, n - s), 0)]) for s in range(0, n, per)]
            continue
        off = -(-used // ALIGN) * ALIGN
        if pieces and off + n * size > cap:
            buckets.append((used, pieces))
            pieces, off = [], 0
        pieces.append((i, 0, n, off))
        used = off + n * size
    if pieces:
        buckets.append((used, pieces))
    return buckets


def payload_bytes(manifest: dict[str, Any]) -> int:
    return sum(nbytes for nbytes, _ in plan(manifest))


def pack(manifest: dict[str, Any], tensors: list[torch.Tensor], device: torch.device | str = "cpu") -> Iterator[torch.Tensor]:
    """The byte tensors to broadcast, one per bucket (``tensors`` in manifest order). A bucket is
    valid until the next one is asked for (one buffer is reused)."""
    entries = manifest["entries"]
    if len(tensors) != len(entries):
        raise ValueError(f"{len(tensors)} tensors for a manifest of {len(entries)}")
    buckets = plan(manifest)
    buf: Optional[torch.Tensor] = None
    for nbytes, pieces in buckets:
        if len(pieces) == 1:  # a slice of one tensor straight from its memory, where it can be
            i, start, count, _ = pieces[0]
            src = tensors[i].detach()
            if src.dtype == dtype_of(entries[i][1]) and src.is_contiguous() and src.device == torch.device(device):
                yield src.reshape(-1)[start:start + count].view(torch.uint8)
                continue
        if buf is None:  # sized to the largest packed bucket, not to bucket_bytes
            buf = torch.empty(max(b for b, _ in buckets), dtype=torch.uint8, device=device)
        for i, start, count, off in pieces:
            dt = dtype_of(entries[i][1])
            dst = buf[off:off + count * _itemsize(entries[i][1])].view(dt)
            dst.copy_(tensors[i].detach().reshape(-1)[start:start + count])
        yield buf[:nbytes]


def unpack(manifest: dict[str, Any], receive: Callable[[torch.Tensor], None],
           device: torch.device | str = "cpu") -> Iterator[list[tuple[str, torch.Tensor]]]:
    """Per bucket, after ``receive(buffer)`` filled it: the tensors it completed, as (name, tensor)."""
    entries = manifest["entries"]
    partial: dict[int, torch.Tensor] = {}
    for nbytes, pieces in plan(manifest):
        done = []
        if len(pieces) == 1 and pieces[0][2] != _numel(entries[pieces[0][0]][2]):  # a slice: straight in
            i, start, count, _ = pieces[0]
            name, dt, shape = entries[i]
            whole = partial.setdefault(i, torch.empty(_numel(shape), dtype=dtype_of(dt), device=device))
            receive(whole[start:start + count].view(torch.uint8))
            if start + count == whole.numel():
                done.append((name, partial.pop(i).view(shape)))
            yield done
            continue
        buf = torch.empty(nbytes, dtype=torch.uint8, device=device)
        receive(buf)
        for i, _, count, off in pieces:
            name, dt, shape = entries[i]
            done.append((name, buf[off:off + count * _itemsize(dt)].view(dtype_of(dt)).view(shape)))
        yield done


class WeightGroup:
    """Learner rank 0 (rank 0, hosting the store) and every engine (ranks 1..N) in one gloo group.
    ``timeout_s`` bounds every collective on it (and forming it, unless ``join_timeout_s``);
    ``bind_ip``: this node's address (the one the others reach it at)."""

    def __init__(self, host: str, port: int, rank: int, world_size: int, timeout_s: float, tag: str = "",
                 bind_ip: Optional[str] = None, join_timeout_s: Optional[float] = None):
        import torch.distributed as dist

        self.rank, self.world_size = rank, world_size
        timeout = datetime.timedelta(seconds=timeout_s)
        joining = datetime.timedelta(seconds=timeout_s if join_timeout_s is None else join_timeout_s)
        from grpo_dist.util.ports import is_loopback, tcp_store

        self._store = tcp_store(host, int(port), world_size, rank == 0, joining)  # listening on ``host`` only
        opts = dist.ProcessGroupGloo._Options()
        opts._timeout = timeout
        gloo = dist.ProcessGroupGloo  # the interface of this node's address (default: the hostname's)
        bind_ip = bind_ip or (host if is_loopback(host) else None)  # one machine: loopback only
        opts._devices = [gloo.create_device(hostname=bind_ip) if bind_ip else gloo.create_default_device()]
        self._pg = dist.ProcessGroupGloo(dist.PrefixStore(f"grpo_dist/weights/{tag}", self._store), rank,
                                         world_size, opts)

    def broadcast(self, tensor: torch.Tensor) -> None:
        """From rank 0 to all (``tensor`` contiguous, on the CPU)."""
        import torch.distributed as dist

        opts = dist.BroadcastOptions()
        opts.rootRank = 0
        self._pg.broadcast([tensor], opts).wait()

    def close(self) -> None:
        pg, self._pg = getattr(self, "_pg", None), None
        if pg is not None:
            try:
                pg.abort()
            except Exception:  # pragma: no cover - best effort
                pass
        self._store = None


def send_header(group: WeightGroup, values: list[int]) -> None:
    group.broadcast(torch.tensor(values, dtype=torch.int64))


def receive_header(group: WeightGroup, n: int) -> list[int]:
    t = torch.empty(n, dtype=torch.int64)
    group.broadcast(t)
    return [int(x) for x in t.tolist()]


def prefetched(items: Iterator, depth: int = 1) -> Iterator:
    """``items`` produced by a thread of its own, at most ``depth`` ahead of the consumer: the
    engine receives bucket k+1 (gloo and the copies release the GIL) while it loads bucket k. An
    error of the producer is raised to the consumer; a consumer that stops early stops it."""
    import queue
    import threading

    q: queue.Queue = queue.Queue(maxsize=depth)
    stop = threading.Event()
    end = object()

    def put(x) -> bool:
        while not stop.is_set():
            try:
                q.put(x, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def produce() -> None:
        try:
            for x in items:
                if not put((None, x)):
                    return
            put((None, end))
        except BaseException as e:  # noqa: BLE001 - handed to the consumer
            put((e, None))

    t = threading.Thread(target=produce, name="grpo-bucket-prefetch", daemon=True)
    t.start()
    try:
        while True:
            err, x = q.get()
            if err is not None:
                raise err
            if x is end:
                return
            yield x
    finally:
        stop.set()
