"""Small metric helpers: unbiased pass@k, masked means, and the loss functions' metric dicts."""

from __future__ import annotations

import math
from typing import Dict, Mapping, Optional, Union

import numpy as np
import torch

__all__ = ["pass_at_k", "masked_mean", "masked_sum", "metric_values", "quantile"]

Metrics = Dict[str, Union[float, torch.Tensor]]


def _as_count(name: str, value) -> int:
    if isinstance(value, bool) or int(value) != value:
        raise ValueError(f"{name} must be an integer, got {value!r}")
    value = int(value)
    if value < 0:
        raise ValueError(f"{name} must be >= 0, got {value}")
    return value


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from ``n`` samples of which ``c`` are correct.

    ``1 - C(n - c, k) / C(n, k)``: the probability that at least one of ``k`` samples drawn
    without replacement from the ``n`` is correct. Computed as the stable product
    ``1 - prod_{i = n - c + 1}^{n} (1 - k / i)`` (no huge binomials).

    Args:
        n: samples drawn (>= 1). c: correct ones (0 <= c <= n). k: budget (1 <= k <= n).

    Returns:
        float in ``[0, 1]``; exactly 1.0 when ``n - c < k`` and 0.0 when ``c == 0``.

    Raises:
        ValueError: negative or non-integer arguments, ``k == 0``, ``k > n`` or ``c > n``.
    """
    n, c, k = _as_count("n", n), _as_count("c", c), _as_count("k", k)
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    if k > n:
        raise ValueError(f"k ({k}) must be <= n ({n})")
    if c > n:
        raise ValueError(f"c ({c}) must be <= n ({n})")
    if n - c < k:
        return 1.0
    if c == 0:
        return 0.0
    prod_fail = 1.0
    for i in range(n - c + 1, n + 1):
        prod_fail *= 1.0 - k / i
    return 1.0 - prod_fail


def masked_sum(x: torch.Tensor, mask: torch.Tensor, dim: Optional[int] = None) -> torch.Tensor:
    """Sum of ``x`` where ``mask`` is nonzero (``mask`` float/bool/int, broadcastable to ``x``).

    Masked-out entries are dropped with ``torch.where`` so NaN/inf there never leak in.
    """
    m = mask.to(torch.bool)
    vals = torch.where(m, x, torch.zeros((), dtype=x.dtype, device=x.device))
    return vals.sum() if dim is None else vals.sum(dim=dim)


def masked_mean(x: torch.Tensor, mask: torch.Tensor, dim: Optional[int] = None) -> torch.Tensor:
    """Mean of ``x`` over entries where ``mask`` is nonzero; 0 (not NaN) where nothing is selected.

    Args:
        x: ``[B, T]`` (any shape). mask: same shape (or broadcastable), float/bool/int.
        dim: reduce over this dim only (e.g. ``dim=-1``: per-row means ``[B]``); None = all.
    """
    m = mask.to(torch.bool)
    if m.shape != x.shape:
        m = m.expand_as(x)
    count = m.sum() if dim is None else m.sum(dim=dim)
    return masked_sum(x, m, dim) / count.clamp(min=1).to(x.dtype)


def metric_values(named: Mapping[str, torch.Tensor], tensors: bool = False) -> Metrics:
    """The metrics a loss function returns: plain floats, all read with one host sync (the
    default), or, with ``tensors``, the detached 0-d float64 tensors themselves and no sync, for a
    caller that reads many micro-batches' metrics at once (the learner reads them once per step)."""
    values = {k: v.detach().to(torch.float64).reshape(()) for k, v in named.items()}
    if tensors or not values:
        return values
    read = torch.stack(list(values.values())).tolist()
    return dict(zip(values.keys(), (float(v) for v in read)))


def quantile(x: torch.Tensor, q: float) -> torch.Tensor:
    """The ``q`` quantile of the values of ``x`` (any shape, flattened), interpolated linearly
    between the two nearest ranks as ``torch.quantile`` does; a 0-d tensor of ``x``'s dtype.
    A selection (numpy's introselect, linear time), so any size works: ``torch.quantile``
    refuses inputs of more than 2**24 values, and ``torch.kthvalue`` takes quadratic time on some
    orders (the smallest value of a descending tensor).

    Raises:
        ValueError: ``x`` empty or ``q`` outside ``[0, 1]``.
    """
    if x.numel() == 0:
        raise ValueError("quantile of an empty tensor")
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"q must lie in [0, 1], got {q}")
    v = x.detach().flatten().cpu()
    v = (v if v.dtype in (torch.float32, torch.float64) else v.float()).numpy()
    pos = q * (v.size - 1)
    lo = int(math.floor(pos))
    hi, w = min(lo + 1, v.size - 1), pos - lo
    part = np.partition(v, (lo, hi))  # introselect: linear time whatever the order of the values
    low = torch.tensor(part[lo], dtype=x.dtype)
    if hi == lo or w == 0.0:
        return low
    return torch.lerp(low, torch.tensor(part[hi], dtype=x.dtype), w)
