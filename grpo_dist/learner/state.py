"""Learner helpers without a model: metric accumulation across micro-batches and ranks,
JSON-safe PEFT configs, and CPU copies of tensors for an ``AdapterUpdate``.
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
             "entropy", "logprob_diff_behaviour_mean", "nll_token_mean")
# Extremes over all micro-batches and ranks (``ratio_min`` is stored negated and reduced with MAX).
MAX_KEYS = ("ratio_max", "ratio_min", "logprob_diff_behaviour_max")
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
            import torch.distributed as dist

            t = torch.tensor(sums + nd, dtype=torch.float64)
            dist.all_reduce(t, op=dist.ReduceOp.SUM)
            m = torch.tensor([x if math.isfinite(x) else -1e300 for x in mx], dtype=torch.float64)
            dist.all_reduce(m, op=dist.ReduceOp.MAX)
            vals = t.tolist()
            sums, nd = vals[:len(SUM_KEYS)], vals[len(SUM_KEYS):]
            mx = [x if x > -1e299 else -math.inf for x in m.tolist()]
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
