"""GRPO losses: clipped policy surrogate, weighted NLL (softmax-weighted variant), aggregation, full GRPO loss.

All per-token outputs are ``[B, T]`` with masked positions exactly 0 (``torch.where``, so a
``-inf`` log-prob in padding never turns into NaN). Masks may be float, bool or int; advantages
/ weights may be ``[B]``, ``[B, 1]`` or per-token ``[B, T]``. Metrics are computed over masked
tokens only (0.0 when there are none) and are plain Python floats, read with one host sync per
call; ``tensor_metrics=True`` returns them as detached 0-d float64 tensors instead (no sync: the
learner reads every micro-batch's metrics once, at the end of its step). ``float(v)`` of such a
tensor is the float the default returns.
"""

from __future__ import annotations

import math
from typing import Dict, Optional, Tuple, Union

import torch

from .kl import KL_KINDS, kl_penalty
from .metrics import Metrics, masked_mean, metric_values

__all__ = ["policy_loss", "weighted_nll_loss", "aggregate", "grpo_loss", "AGG_MODES"]

AGG_MODES = ("seq-mean-token-mean", "token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm")
RATIO_LEVELS = ("token", "sequence")
_LOG_RATIO_CLAMP = 20.0  # token log-ratio clamp before exp
_SEQ_LOG_RATIO_MAX = 10.0  # GSPO sequence log-ratio clamp (verl)

Number = Union[int, float, torch.Tensor]


def _bool_mask(mask: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    if like.dim() != 2:
        raise ValueError(f"per-token tensors must be [B, T], got shape {tuple(like.shape)}")
    if tuple(mask.shape) != tuple(like.shape):
        raise ValueError(f"mask shape {tuple(mask.shape)} must equal {tuple(like.shape)}")
    return mask.to(device=like.device, dtype=torch.bool)


def _per_row(x: torch.Tensor, like: torch.Tensor, name: str) -> torch.Tensor:
    """``[B]`` / ``[B, 1]`` / ``[B, T]`` -> broadcastable ``[B, 1]`` or ``[B, T]`` in like's dtype."""
    x = torch.as_tensor(x, device=like.device)
    b, t = like.shape
    if x.dim() == 1 and x.shape[0] == b:
        x = x.unsqueeze(1)
    elif not (x.dim() == 2 and x.shape[0] == b and x.shape[1] in (1, t)):
        raise ValueError(f"{name} must have shape [B], [B, 1] or [B, T] with B={b}, T={t}; got {tuple(x.shape)}")
    return x.to(like.dtype)


def _zeros_where_masked(x: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    return torch.where(m, x, torch.zeros((), dtype=x.dtype, device=x.device))


def policy_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_low: Optional[float] = 0.2,
    clip_high: Optional[float] = 0.2,
    dual_clip: Optional[float] = None,
    ratio_level: str = "token",
    tensor_metrics: bool = False,
) -> Tuple[torch.Tensor, Metrics]:
    """PPO/GRPO clipped surrogate, per token.

    ``loss = -min(ratio * A, clip(ratio, 1 - clip_low, 1 + clip_high) * A)``, i.e. the pessimistic
    side of the clipped objective (A>0, ratio 1.8 -> 1.2A; A<0, ratio 1.8 -> 1.8A;
    A>0, ratio 0.4 -> 0.4A; A<0, ratio 0.4 -> 0.8A).

    Args:
        logp: ``[B, T]`` current policy log-probs (with grad).
        old_logp: ``[B, T]`` behaviour / old policy log-probs (no grad expected). With a single
            update per batch pass ``logp.detach()`` (DeepSeekMath's "no grad" copy): ratio == 1.
        advantages: ``[B]``, ``[B, 1]`` or ``[B, T]``.
        mask: ``[B, T]`` completion mask (float/bool/int).
        clip_low / clip_high: ratio clipped to ``[1 - clip_low, 1 + clip_high]`` (DAPO's
            decoupled clip); ``None`` disables that side.
        dual_clip: ``c > 1`` (e.g. 3.0): for ``A < 0`` the loss is capped at ``-c * A`` (dual-clip
            PPO, verl's ``clip_ratio_c``), bounding the update when ``ratio >> 1``.
        ratio_level: ``"token"``: ratio ``exp(clamp(logp - old_logp, +-20))`` per token;
            ``"sequence"`` (GSPO): ``s_i = exp(min(masked_mean_t(logp - old_logp), 10))`` shared by
            all tokens of row i, applied per token as ``exp(logp - logp.detach() + log s_i.detach())``
            so gradients flow per token. With ``"seq-mean-token-mean"`` aggregation this gives
            exactly GSPO's sequence gradient ``s_i * mean_t grad logp_t``.
        tensor_metrics: metrics as 0-d tensors, not floats (see the module's docstring).

    Returns:
        ``(per_token_loss [B, T], metrics)``. Metrics over masked tokens: ``clip_frac_low``
        (ratio < 1 - clip_low and A < 0: lower clip active), ``clip_frac_high`` (ratio >
        1 + clip_high and A > 0), ``clip_frac`` (either), ``dual_clip_frac`` (A < 0 and ratio > c),
        ``ratio_mean``, ``ratio_max``, ``ratio_min``.
    """
    if ratio_level not in RATIO_LEVELS:
        raise ValueError(f"unknown ratio_level {ratio_level!r}; expected one of {RATIO_LEVELS}")
    for name, c in (("clip_low", clip_low), ("clip_high", clip_high)):
        if c is not None and not c >= 0:
            raise ValueError(f"{name} must be >= 0 or None, got {c}")
    if dual_clip is not None and not dual_clip > 1.0:
        raise ValueError(f"dual_clip must be > 1 (e.g. 3.0) or None, got {dual_clip}")
    m = _bool_mask(mask, logp)
    if old_logp.shape != logp.shape:
        raise ValueError(f"old_logp shape {tuple(old_logp.shape)} must equal logp shape {tuple(logp.shape)}")
    adv = _per_row(advantages, logp, "advantages")
    lp = _zeros_where_masked(logp, m)
    olp = _zeros_where_masked(old_logp.to(logp.dtype), m)

    if ratio_level == "token":
        log_ratio = torch.clamp(lp - olp, -_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP)
    else:
        seq_log_ratio = masked_mean(lp - olp, m, dim=-1).clamp(max=_SEQ_LOG_RATIO_MAX)
        log_ratio = lp - lp.detach() + seq_log_ratio.detach().unsqueeze(-1)
    ratio = torch.exp(log_ratio)

    lo = 1.0 - clip_low if clip_low is not None else -math.inf
    hi = 1.0 + clip_high if clip_high is not None else math.inf
    loss_unclipped = -adv * ratio
    loss_clipped = -adv * torch.clamp(ratio, lo, hi)
    loss = torch.maximum(loss_unclipped, loss_clipped)
    if dual_clip is not None:
        loss = torch.where(adv < 0, torch.minimum(loss, -adv * dual_clip), loss)
    per_token = _zeros_where_masked(loss, m)

    with torch.no_grad():
        r = ratio.detach()
        a = adv.detach().expand_as(r)
        n = m.sum().clamp(min=1).to(torch.float64)
        low = (r < lo) & (a < 0) & m
        high = (r > hi) & (a > 0) & m
        dual = (a < 0) & (r > dual_clip) & m if dual_clip is not None else torch.zeros_like(m)
        has = m.any()
        rmax = torch.where(m, r, torch.full_like(r, -math.inf)).max() if r.numel() else r.new_zeros(())
        rmin = torch.where(m, r, torch.full_like(r, math.inf)).min() if r.numel() else r.new_zeros(())
        metrics = metric_values({
            "clip_frac_low": low.sum() / n,
            "clip_frac_high": high.sum() / n,
            "clip_frac": (low | high).sum() / n,
            "dual_clip_frac": dual.sum() / n,
            "ratio_mean": masked_mean(r, m),
            "ratio_max": torch.where(has, rmax, torch.zeros_like(rmax)),
            "ratio_min": torch.where(has, rmin, torch.zeros_like(rmin)),
        }, tensor_metrics)
    return per_token, metrics


def weighted_nll_loss(
    logp: torch.Tensor, weights: torch.Tensor, mask: torch.Tensor, *, tensor_metrics: bool = False
) -> Tuple[torch.Tensor, Metrics]:
    """The group-wise softmax-weighted variant's weighted negative log-likelihood, per token: ``-w_i * logp[i, t]``.

    Args:
        logp: ``[B, T]`` policy log-probs of the completions. weights: ``[B]`` / ``[B, 1]``
            (e.g. :func:`softmax_weights`). mask: ``[B, T]``. tensor_metrics: metrics as 0-d
            tensors, not floats (see the module's docstring).

    Returns:
        ``(per_token_loss [B, T], metrics)``; metrics: ``nll_token_mean`` (masked mean of -logp),
        ``seq_logp_mean`` (mean over rows of sum_t logp), ``weight_min``, ``weight_max``.

    Mapping to that variant (weights sum to 1 within each group; rows = completions):

    * Its formula ``L = -sum_i w_i log pi(y_i|x)`` with ``log pi(y|x) = sum_t logp_t`` is
      ``aggregate(per_token, mask, "seq-mean-token-sum", global_seqs=1)`` (= B times the default
      ``/B`` normalisation; summed over all groups in the batch).
    * Its reference code computes ``log pi`` as ``-F.cross_entropy(...)``, a *token mean*; that
      variant is ``aggregate(per_token, mask, "seq-mean-token-mean", global_seqs=1)``.
    """
    m = _bool_mask(mask, logp)
    w = _per_row(weights, logp, "weights")
    lp = _zeros_where_masked(logp, m)
    per_token = _zeros_where_masked(-w * lp, m)
    with torch.no_grad():
        wd = w.detach()
        metrics = metric_values({
            "nll_token_mean": masked_mean(-lp.detach(), m),
            "seq_logp_mean": lp.detach().sum(-1).mean() if lp.shape[0] else lp.new_zeros(()),
            "weight_min": wd.min() if wd.numel() else wd.new_zeros(()),
            "weight_max": wd.max() if wd.numel() else wd.new_zeros(()),
        }, tensor_metrics)
    return per_token, metrics


def _safe_denominator(value: Number, like: torch.Tensor) -> torch.Tensor:
    d = torch.as_tensor(value, dtype=like.dtype, device=like.device)
    return torch.where(d > 0, d, torch.ones_like(d))


def aggregate(
    per_token_loss: torch.Tensor,
    mask: torch.Tensor,
    mode: str = "seq-mean-token-mean",
    max_len: Optional[int] = None,
    global_tokens: Optional[Number] = None,
    global_seqs: Optional[Number] = None,
) -> torch.Tensor:
    """Reduce a ``[B, T]`` per-token loss to a 0-d tensor.

    Modes (l = loss, m = mask, n_i = tokens of row i):

    * ``"seq-mean-token-mean"``: ``sum_i (sum_t l m / max(n_i, 1)) / B`` (TRL/DeepSeekMath; a fully
      masked row counts as a row with loss 0).
    * ``"token-mean"``: ``sum(l m) / sum(m)`` (DAPO).
    * ``"seq-mean-token-sum"``: ``sum(l m) / B``.
    * ``"seq-mean-token-sum-norm"``: ``sum(l m) / (B * max_len)`` (Dr. GRPO), ``max_len`` default T.

    Distributed / gradient accumulation: pass ``global_tokens`` (total masked tokens over all
    micro-batches and ranks; used by ``token-mean``) or ``global_seqs`` (total rows; used by the
    three ``seq-*`` modes) to replace the local ``sum(m)`` / ``B``. Then the sum of the results
    over micro-batches equals the single-process loss of the whole batch (for Dr. GRPO also pass
    the same ``max_len`` to every micro-batch, since each may be padded to a different T).
    ``global_seqs=1`` turns the seq modes into plain sums over rows.

    A denominator of 0 (fully masked / empty batch) is replaced by 1, so the result is 0, never NaN.
    """
    if mode not in AGG_MODES:
        raise ValueError(f"unknown aggregation mode {mode!r}; expected one of {AGG_MODES}")
    m = _bool_mask(mask, per_token_loss)
    l = _zeros_where_masked(per_token_loss, m)
    b, t = l.shape
    if mode == "token-mean":
        denom = global_tokens if global_tokens is not None else m.sum()
        return l.sum() / _safe_denominator(denom, l)
    seqs = global_seqs if global_seqs is not None else b
    if mode == "seq-mean-token-mean":
        row_mean = l.sum(-1) / m.sum(-1).clamp(min=1).to(l.dtype)
        return row_mean.sum() / _safe_denominator(seqs, l)
    if mode == "seq-mean-token-sum":
        return l.sum() / _safe_denominator(seqs, l)
    if max_len is None:
        max_len = t
    if not max_len > 0:
        raise ValueError(f"max_len must be > 0, got {max_len}")
    return l.sum() / (_safe_denominator(seqs, l) * float(max_len))


def grpo_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    ref_logp: Optional[torch.Tensor],
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    beta: float = 0.04,
    clip_low: Optional[float] = 0.2,
    clip_high: Optional[float] = 0.2,
    dual_clip: Optional[float] = None,
    kl_kind: str = "k3",
    agg: str = "seq-mean-token-mean",
    max_len: Optional[int] = None,
    ratio_level: str = "token",
    global_tokens: Optional[Number] = None,
    global_seqs: Optional[Number] = None,
    is_weights: Optional[torch.Tensor] = None,
    tensor_metrics: bool = False,
) -> Tuple[torch.Tensor, Metrics]:
    """Full GRPO loss: ``aggregate(is_weights * policy_loss + beta * kl_penalty(logp, ref_logp))``.

    Args:
        logp, old_logp: ``[B, T]`` current / behaviour log-probs. ref_logp: ``[B, T]`` reference
            log-probs, or None when ``beta == 0``. advantages: ``[B]`` / ``[B, 1]`` / ``[B, T]``.
        mask: ``[B, T]``. is_weights: ``[B, T]`` / ``[B]`` / ``[B, 1]`` rollout importance
            weights (:func:`grpo_dist.algo.rollout_is_weights`; no gradient taken through them)
            multiplying the per-token policy loss only, not the KL term; None = 1 (bit for bit the
            unweighted loss). tensor_metrics: metrics as 0-d tensors, not floats (see the
            module's docstring; the floats are read in one go, the policy's with the rest). Other
            keywords: see :func:`policy_loss`, :func:`kl_penalty`, :func:`aggregate`.

    Returns:
        ``(loss 0-d tensor, metrics)``: the policy metrics plus ``loss``, ``loss_policy``
        (aggregated policy term), ``loss_kl`` (aggregated ``beta * kl`` term, so ``loss =
        loss_policy + loss_kl``) and, whenever ``ref_logp`` is given (even with ``beta == 0``),
        ``kl_mean`` = masked token mean of the unscaled KL estimator.

    Mappings: a ratio against the reference with a token mean ("GRPO 101") = ``old_logp=ref_logp,
    kl_kind="k3", agg="token-mean"``; the ``seed_notebook`` preset's ``compute_grpo_loss`` (ratio vs old, naive KL
    ``mean(log_new - log_old)``) = ``ref_logp=old_logp, kl_kind="k1", agg="token-mean"`` with T=1.
    """
    if kl_kind not in KL_KINDS:
        raise ValueError(f"unknown kl_kind {kl_kind!r}; expected one of {KL_KINDS}")
    if beta != 0 and ref_logp is None:
        raise ValueError(f"ref_logp is required when beta != 0 (beta={beta})")
    per_token, metrics = policy_loss(
        logp, old_logp, advantages, mask,
        clip_low=clip_low, clip_high=clip_high, dual_clip=dual_clip, ratio_level=ratio_level, tensor_metrics=True,
    )
    m = _bool_mask(mask, logp)
    if is_weights is not None:
        per_token = _zeros_where_masked(per_token * _per_row(is_weights.detach(), logp, "is_weights"), m)
    agg_kw = dict(mode=agg, max_len=max_len, global_tokens=global_tokens, global_seqs=global_seqs)
    extra: Dict[str, torch.Tensor] = {}
    kl_term = None
    if ref_logp is not None:
        if ref_logp.shape != logp.shape:
            raise ValueError(f"ref_logp shape {tuple(ref_logp.shape)} must equal logp shape {tuple(logp.shape)}")
        kl = _zeros_where_masked(
            kl_penalty(_zeros_where_masked(logp, m), _zeros_where_masked(ref_logp.to(logp.dtype), m), kl_kind), m
        )
        extra["kl_mean"] = masked_mean(kl.detach(), m)
        if beta != 0:
            kl_term = beta * kl
    total = per_token + kl_term if kl_term is not None else per_token
    loss = aggregate(total, mask, **agg_kw)
    with torch.no_grad():
        extra["loss_policy"] = aggregate(per_token.detach(), mask, **agg_kw)
        extra["loss_kl"] = (
            aggregate(kl_term.detach(), mask, **agg_kw) if kl_term is not None else loss.new_zeros(())
        )
        extra["loss"] = loss.detach()
    return loss, metric_values({**metrics, **extra}, tensor_metrics)
