"""Learner helpers without a model: metric accumulation across micro-batches and ranks, the
learner's own collectives on the right device, JSON-safe PEFT configs, and CPU copies of tensors
for an ``AdapterUpdate``.

Collectives and their devices (the audit of ``grpo_dist/learner``; ``grpo_dist/algo`` has none):

* ``all_reduce_floats`` (global token/sequence counts, the metric sums and extremes, the kept-token
  count of ``top_entropy_frac``) and ``barrier`` (``weights_io``): on ``collective_device()``, the
  device the process group's backend takes -- CUDA for NCCL (which rejects CPU tensors: "No
  backend type associated with device type cpu"), CPU for gloo / MPI / a ``cpu:gloo,...`` group.
* ``all_gather_object`` (the entropy pool of ``top_entropy_frac``): torch picks the device itself
  (the current CUDA device for NCCL, set by ``Learner.setup``); the gathered objects are CPU tensors.
* DeepSpeed's own collectives (gradient reduction, ZeRO partition gathers in ``GatheredParameters``)
  run on the engine's device.
"""

from __future__ import annotations

import enum
import math
import zlib
from typing import Any, Iterable, Mapping, Optional

import torch

# Loss terms are normalised by *global* counts, so micro-batch and rank values add up to the
# whole-batch value: they are summed, not averaged.
SUM_KEYS = ("loss", "loss_policy", "loss_kl")
# Output names (``train/<name>``) where they differ from the algo metric names.
RENAME = {"kl_mean": "kl"}


def reduction(name: str) -> str:
    """How metric ``name`` combines over micro-batches and ranks: ``"sum"`` (the loss terms),
    ``"max"`` (``*_max``), ``"min"`` (``*_min``), ``"seq"`` (``seq_*``: a mean over sequences)
    or ``"mean"`` (anything else: a mean weighted by the completion tokens)."""
    if name in SUM_KEYS:
        return "sum"
    if name.endswith("_max"):
        return "max"
    if name.endswith("_min"):
        return "min"
    return "seq" if name.startswith("seq_") else "mean"


class MetricAccumulator:
    """Any metric name, reduced as :func:`reduction` says. Values and weights may be floats or 0-d
    tensors: tensors are read once, in ``reduce`` (one host sync per step, not one per micro-batch).

    With several ranks every rank must have added the same names (they run the same code on
    their shards); ``reduce`` checks that with a hash of the names riding along in its
    all-reduce, and raises rather than mix up two names' values."""

    def __init__(self) -> None:
        self._entries: dict[str, list[tuple[Any, float]]] = {}

    def add(self, metrics: Mapping[str, Any], tokens: Any, seqs: Any = 0.0) -> None:
        """One micro-batch's ``metrics`` over ``tokens`` completion tokens and ``seqs`` sequences
        (the weights of the means; a float or a 0-d tensor); a min / max over no tokens is left
        out (when the weights are read)."""
        for k, v in metrics.items():
            kind = reduction(k)
            self.add_weighted(k, v, 1.0 if kind == "sum" else seqs if kind == "seq" else tokens)

    def add_weighted(self, key: str, value: Any, weight: Any) -> None:
        """``key``'s ``value`` with weight ``weight`` (a float or a 0-d tensor) in its mean, or, for
        a min / max, counted when the weight is > 0. The name exists on every rank, weight or not."""
        self._entries.setdefault(key, []).append((value, weight if isinstance(weight, torch.Tensor) else float(weight)))

    def _read(self) -> dict[str, list[tuple[float, float]]]:
        """Every value and weight as a float: the tensors among them stacked and read in one go."""
        tensors = [x for es in self._entries.values() for e in es for x in e if isinstance(x, torch.Tensor)]
        read = iter(torch.stack([t.detach().reshape(()).double() for t in tensors]).tolist() if tensors else [])

        def value(x: Any) -> float:
            return next(read) if isinstance(x, torch.Tensor) else float(x)

        return {k: [(value(v), value(w)) for v, w in es] for k, es in self._entries.items()}

    def reduce(self, world_size: int, iterations: int = 1) -> dict[str, float]:
        """All-reduce over ranks (when ``world_size > 1``: one SUM and one MAX) and return
        ``train/*`` floats. Sums are divided by ``iterations`` (the mean over the updates of one
        step); a name without weight on every rank (a ``*_max`` over no tokens) is left out."""
        values = self._read()
        names = sorted(values)
        kinds = {k: reduction(k) for k in names}
        summed = [k for k in names if kinds[k] not in ("max", "min")]
        extreme = [k for k in names if kinds[k] in ("max", "min")]
        sums = ([sum(v * (1.0 if kinds[k] == "sum" else w) for v, w in values[k]) for k in summed]
                + [sum(w for _, w in values[k]) for k in summed])
        # *_min rides along negated, so that one MAX reduction serves both
        ext = [max(((v if kinds[k] == "max" else -v) for v, w in values[k] if w > 0), default=-math.inf)
               for k in extreme]
        if world_size > 1:
            digest = float(zlib.crc32("\n".join(names).encode()))
            sums = all_reduce_floats(sums, "sum")
            got = all_reduce_floats([x if math.isfinite(x) else -1e300 for x in ext] + [digest, -digest], "max")
            if got[-2:] != [digest, -digest]:
                raise RuntimeError(f"the learner ranks reported different metric names (this rank: {names})")
            ext = [x if x > -1e299 else -math.inf for x in got[:-2]]
        out: dict[str, float] = {}
        n = len(summed)
        for i, k in enumerate(summed):
            if kinds[k] == "sum":
                out[f"train/{k}"] = sums[i] / max(1, iterations)
            elif sums[n + i] > 0:
                out[f"train/{RENAME.get(k, k)}"] = sums[i] / sums[n + i]
        for k, v in zip(extreme, ext):
            if math.isfinite(v):
                out[f"train/{RENAME.get(k, k)}"] = v if kinds[k] == "max" else -v
        return out


def collective_device(backend: Optional[str] = None, cuda_index: Optional[int] = None) -> torch.device:
    """The device whose tensors ``backend`` reduces (default: the default process group's backend).

    ``nccl`` -> ``cuda:<cuda_index>`` (default the current CUDA device: ``Learner.setup`` sets it);
    ``gloo``, ``mpi``, ``ccl`` and any group that has a CPU backend (``"cpu:gloo,cuda:nccl"``) ->
    CPU: the values reduced here are host floats, so CPU avoids two copies where it is allowed.
    """
    if backend is None:
        import torch.distributed as dist

        backend = str(dist.get_backend())
    b = backend.lower()
    if "cpu:" in b or "nccl" not in b:
        return torch.device("cpu")
    return torch.device("cuda", torch.cuda.current_device() if cuda_index is None else int(cuda_index))


def all_reduce_floats(values: list[float], op: str = "sum") -> list[float]:
    """All-reduce a list of floats (float64) over the default group, on the backend's device.
    ``op``: ``"sum"`` or ``"max"``. Every rank must call it with the same length."""
    import torch.distributed as dist

    ops = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX}
    t = torch.tensor(values, dtype=torch.float64, device=collective_device())
    dist.all_reduce(t, op=ops[op])
    return t.tolist()


def barrier() -> None:
    """``dist.barrier`` on the backend's device (NCCL is told which GPU instead of guessing)."""
    import torch.distributed as dist

    dev = collective_device()
    if dev.type == "cuda":
        dist.barrier(device_ids=[dev.index])
    else:
        dist.barrier()


def json_safe(x: Any) -> Any:
    """Sets -> sorted lists, enums -> values, tuples -> lists, recursively (for PEFT configs)."""
    if isinstance(x, enum.Enum):
        return json_safe(x.value)
    if isinstance(x, Mapping):
        return {str(k): json_safe(v) for k, v in x.items()}
    if isinstance(x, (set, frozenset)):
        return sorted(json_safe(v) for v in x)
    if isinstance(x, (list, tuple)):
        return [json_safe(v) for v in x]
    if x is None or isinstance(x, (bool, int, float, str)):
        return x
    return str(x)


def cpu_copies(named: Iterable[tuple[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Detached, contiguous CPU clones (safe to pickle and to keep after training continues)."""
    return {k: v.detach().to("cpu", copy=True).contiguous() for k, v in named}


def cpu_tensors(named: Iterable[tuple[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Detached, contiguous CPU tensors: the same memory where they already are (no copy)."""
    return {k: v.detach().to("cpu").contiguous() for k, v in named}


def strip_prefixes(name: str, prefixes: tuple[str, ...] = ("module.", "_orig_mod.")) -> str:
    changed = True
    while changed:
        changed = False
        for p in prefixes:
            if name.startswith(p):
                name, changed = name[len(p):], True
    return name


def global_norm(tensors: Iterable[Optional[torch.Tensor]]) -> float:
    """The 2-norm of all ``tensors`` together, in float64, read with one host sync."""
    norms = [torch.linalg.vector_norm(t.detach(), dtype=torch.float64) for t in tensors if t is not None]
    return float(torch.linalg.vector_norm(torch.stack(norms))) if norms else 0.0
