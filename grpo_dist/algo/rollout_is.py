"""Rollout importance sampling: correct the behaviour (rollout engine) / learner mismatch.

The rollout engine (vLLM, or the transformers backend) samples completions with its own
numerics and, in async mode, with an adapter one or more versions older than the learner's. Its
log-probs ``logp_behaviour`` travel with the batch. The learner's log-probs of the same tokens
under its current weights *before* the update, ``logp_old`` (the proximal policy pi_old), differ
from them. This module turns the per-token log-ratio ``logp_old - logp_behaviour`` into bounded
importance weights that multiply the per-token policy loss:

    loss_t = w_t * policy_loss_t(pi_theta / pi_old)      (clipped PPO/GRPO surrogate, unchanged)
    w_t    = bound(pi_old / pi_behaviour)                (no gradient)

so the trust region (the clip, around pi_old) and the off-policy correction (pi_old vs the
policy that really sampled) are separate: the *decoupled* PPO objective.

What this follows (read, not copied):

* Feng Yao et al., "Your Efficient RL Framework Secretly Brings You Off-Policy RL Training"
  (2025, the TIS blog): the sampler's and the trainer's probabilities of the same token differ;
  weight the policy gradient by the *truncated* importance ratio
  ``min(pi_trainer(a) / pi_sampler(a), C)`` (token level), for PPO with pi_trainer = the
  trainer's old policy, leaving the clipped objective as it is.
* verl's rollout importance sampling (``docs/advance/rollout_is.md``, Yingru Li; Liu, Li et
  al. 2025, "When Speed Kills Stability"): ``rollout_is_weights = pi_old_train / pi_rollout``
  with ``old_log_prob`` recomputed by the training engine; levels ``token`` (per token) and
  ``sequence`` (the product over the completion = ``exp(sum_t log-ratio)``); modes ``truncate``
  (cap at the upper threshold only, TIS) and ``mask`` (reject tokens / sequences whose ratio is
  outside ``[lower, upper]``, lower defaulting to ``1 / upper``); the weights carry no gradient
  and multiply the policy-gradient term only (not the KL term).

Differences, on purpose: in ``mask`` mode a rejected token's weight is 0 here (verl keeps the
true ratio and zeroes the response mask instead, which also changes the loss denominator); the
loss normalisation counts of :func:`grpo_dist.algo.aggregate` are left unchanged, so a rejected
token counts as a token with zero policy loss and keeps its KL term. verl's "geometric" level
and veto threshold are not implemented.
"""

from __future__ import annotations

import math
from typing import Optional, Tuple

import torch

from .metrics import Metrics, masked_mean, metric_values

__all__ = ["IS_MODES", "IS_LEVELS", "rollout_is_weights"]

IS_MODES = ("none", "truncate", "mask")
IS_LEVELS = ("token", "sequence")
_LOG_RATIO_CLAMP = 20.0  # token and sequence log-ratios are clamped to +-20 before exp (e^20 ~ 4.9e8)


def rollout_is_weights(
    old_logp: torch.Tensor,
    behaviour_logp: torch.Tensor,
    mask: torch.Tensor,
    mode: str = "truncate",
    level: str = "token",
    threshold: float = 2.0,
    threshold_low: Optional[float] = None,
    tensor_metrics: bool = False,
) -> Tuple[torch.Tensor, Metrics]:
    """Bounded importance weights ``pi_old / pi_behaviour`` for the per-token policy loss.

    Args:
        old_logp: ``[B, T]`` the learner's log-probs of the sampled tokens under the proximal
            policy pi_old (no grad; detached here anyway).
        behaviour_logp: ``[B, T]`` the rollout engine's log-probs of the same tokens.
        mask: ``[B, T]`` completion mask (float/bool/int).
        mode: ``"none"``: weights = mask (1 on completion tokens; identity on the loss).
            ``"truncate"`` (TIS): ``w = min(r, threshold)``. ``"mask"``: ``w = r`` where
            ``threshold_low <= r <= threshold``, else 0 (the token / sequence is dropped).
        level: ``"token"``: ``r_t = exp(logp_old_t - logp_behaviour_t)``; ``"sequence"``:
            ``r_i = exp(sum_t m_t (logp_old_t - logp_behaviour_t))`` (the product of the token
            ratios over the completion), shared by every token of row i. Log-ratios (per token,
            and the row sum) are clamped to ``+-20`` before ``exp``; truncation is done in log
            space, so a huge ratio never overflows.
        threshold: upper bound ``C > 0`` (truncate: the cap; mask: the upper limit).
        threshold_low: lower limit of ``mask`` (default ``1 / threshold``); must be None for
            the other modes.
        tensor_metrics: the metrics as detached 0-d float64 tensors (no host sync; ``float(v)``
            is the float the default reads), for a caller that reads them once per step.

    Returns:
        ``(weights [B, T], metrics)``: weights in ``logp``'s float dtype, no grad, exactly 0 at
        masked positions. Metrics (plain floats, over completion tokens; a row of the sequence
        level counts with its tokens; all 0.0 without tokens; none for ``mode="none"``):
        ``is_weight_mean`` / ``is_weight_max`` (the weights applied), ``is_ratio_max`` (the raw
        ratio before truncation / masking), ``is_clipped_frac`` (truncate: ratio > threshold)
        or ``is_masked_frac`` (mask: ratio outside the bounds).

    Raises:
        ValueError: unknown mode / level, a threshold <= 0, ``threshold_low`` not in
        ``(0, threshold]``, ``threshold_low`` given for a mode other than ``mask``, shapes that
        differ.
    """
    if mode not in IS_MODES:
        raise ValueError(f"unknown rollout IS mode {mode!r}; expected one of {IS_MODES}")
    if level not in IS_LEVELS:
        raise ValueError(f"unknown rollout IS level {level!r}; expected one of {IS_LEVELS}")
    if not threshold > 0:
        raise ValueError(f"threshold must be > 0, got {threshold}")
    if threshold_low is not None and mode != "mask":
        raise ValueError(f"threshold_low is only used by mode 'mask', got mode {mode!r}")
    low = 1.0 / threshold if threshold_low is None else float(threshold_low)
    if not 0 < low <= threshold:
        raise ValueError(f"threshold_low must be in (0, threshold={threshold}], got {threshold_low}")
    if old_logp.dim() != 2 or behaviour_logp.shape != old_logp.shape or tuple(mask.shape) != tuple(old_logp.shape):
        raise ValueError(f"old_logp, behaviour_logp and mask must be the same [B, T] shape; got "
                         f"{tuple(old_logp.shape)}, {tuple(behaviour_logp.shape)}, {tuple(mask.shape)}")
    dtype = old_logp.dtype if old_logp.is_floating_point() else torch.float32
    m = mask.to(device=old_logp.device, dtype=torch.bool)
    zero = torch.zeros((), dtype=dtype, device=old_logp.device)
    if mode == "none":
        return m.to(dtype), {}

    with torch.no_grad():
        lr = torch.where(m, old_logp.detach().to(dtype) - behaviour_logp.to(device=old_logp.device, dtype=dtype), zero)
        lr = lr.clamp(-_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP)
        if level == "sequence":
            lr = lr.sum(-1, keepdim=True).clamp(-_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP).expand_as(lr)
        log_hi, log_lo = math.log(threshold), math.log(low)
        if mode == "truncate":
            out = lr > log_hi
            w = torch.exp(lr.clamp(max=log_hi))
            frac_key = "is_clipped_frac"
        else:
            out = (lr > log_hi) | (lr < log_lo)
            w = torch.where(out, zero, torch.exp(lr))
            frac_key = "is_masked_frac"
        w = torch.where(m, w, zero)
        has = m.any()
        neg = torch.full_like(w, -math.inf)
        wmax = torch.where(m, w, neg).max() if w.numel() else w.new_zeros(())
        rmax = torch.where(m, torch.exp(lr), neg).max() if w.numel() else w.new_zeros(())
        named = {
            "is_weight_mean": masked_mean(w, m),
            "is_weight_max": torch.where(has, wmax, zero),
            "is_ratio_max": torch.where(has, rmax, zero),
            frac_key: (out & m).sum().to(torch.float64) / m.sum().clamp(min=1).to(torch.float64),
        }
    return w, metric_values(named, tensor_metrics)
