"""Learner helpers without a model: metric accumulation across micro-batches and ranks, the
learner's own collectives on the right device, JSON-safe PEFT configs, and CPU copies of tensors
for an ``AdapterUpdate``.

Collectives and their devices (the audit of ``grpo_dist/learner``; ``grpo_dist/algo`` has none):

* ``all_reduce_floats`` (global token/sequence counts, the metric sums and maxima, the kept-token
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
from typing import Any, Iterable, Mapping, Optional

import torch

# Loss terms are normalised by *global* counts, so micro-batch and rank values add up to the
# whole-batch value: they are summed, not averaged.
SUM_KEYS = ("loss", "loss_policy", "loss_kl")
# Per-token diagnostics: averaged over micro-batches and ranks weighted by their token counts.
MEAN_KEYS = ("kl_mean", "clip_frac_low", "clip_frac_high", "clip_frac", "dual_clip_frac", "ratio_mean",
             "entropy", "logprob_diff_behaviour_mean", "nll_token_mean",
             "is_weight_mean", "is_clipped_frac", "is_masked_frac")
# Extremes over all micro-batches and ranks (``ratio_min`` is stored negated and reduced with MAX).
MAX_KEYS = ("ratio_max", "ratio_min", "logprob_diff_behaviour_max", "is_weight_max", "is_ratio_max")
# Output names (``train/<name>``) where they differ from the algo metric names.
RENAME = {"kl_mean": "kl"}


class MetricAccumulator:
    """Fixed key set (identical on every rank, so one all-reduce of a packed tensor works)."""

    def __init__(self) -> None:
        self.sums = {k: 0.0 for k in SUM_KEYS}
        self.num = {k: 0.0 for k in MEAN_KEYS}
        self.den = {k: 0.0 for k in MEAN_KEYS}
        self.max = {k: -math.inf for k in MAX_KEYS}

    def add(self, metrics: Mapping[str, float], tokens: float) -> None:
        for k, v in metrics.items():
            if k in self.sums:
                self.sums[k] += float(v)
            elif k in self.num:
                self.num[k] += float(v) * tokens
                self.den[k] += tokens
            elif k in self.max and tokens > 0:
                v = -float(v) if k == "ratio_min" else float(v)
                self.max[k] = max(self.max[k], v)

    def add_weighted(self, key: str, value: float, weight: float) -> None:
        self.num[key] += float(value) * weight
        self.den[key] += weight

    def reduce(self, world_size: int, iterations: int = 1) -> dict[str, float]:
        """All-reduce over ranks (when ``world_size > 1``) and return ``train/*`` floats.

        Sums are divided by ``iterations`` (mean over the updates of one step); keys no rank saw
        (e.g. ``clip_frac_high`` for the weighted NLL loss) are left out.
        """
        sums = [self.sums[k] for k in SUM_KEYS]
        nd = [self.num[k] for k in MEAN_KEYS] + [self.den[k] for k in MEAN_KEYS]
        mx = [self.max[k] for k in MAX_KEYS]
        if world_size > 1:
            vals = all_reduce_floats(sums + nd, "sum")
            m = all_reduce_floats([x if math.isfinite(x) else -1e300 for x in mx], "max")
            sums, nd = vals[:len(SUM_KEYS)], vals[len(SUM_KEYS):]
            mx = [x if x > -1e299 else -math.inf for x in m]
        out: dict[str, float] = {}
        for k, v in zip(SUM_KEYS, sums):
            out[f"train/{k}"] = v / max(1, iterations)
        n = len(MEAN_KEYS)
        for i, k in enumerate(MEAN_KEYS):
            if nd[n + i] > 0:
                out[f"train/{RENAME.get(k, k)}"] = nd[i] / nd[n + i]
        for k, v in zip(MAX_KEYS, mx):
            if math.isfinite(v):
                out[f"train/{k}"] = -v if k == "ratio_min" else v
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


def strip_prefixes(name: str, prefixes: tuple[str, ...] = ("module.", "_orig_mod.")) -> str:
    changed = True
    while changed:
        changed = False
        for p in prefixes:
            if name.startswith(p):
                name, changed = name[len(p):], True
    return name


def global_norm(tensors: Iterable[Optional[torch.Tensor]]) -> float:
    sq = 0.0
    for t in tensors:
        if t is not None:
            sq += float(t.detach().double().pow(2).sum())
    return math.sqrt(sq)
