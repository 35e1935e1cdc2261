"""The learner's loss: the config's ``algo`` section mapped onto ``grpo_dist.algo`` (no model here)."""

from __future__ import annotations

from typing import Optional

import torch

from grpo_dist.algo import aggregate, grpo_loss, kl_penalty, masked_mean, weighted_nll_loss


def compute_loss(algo, logp: torch.Tensor, old_logp: torch.Tensor, ref_logp: Optional[torch.Tensor],
                 advantages: torch.Tensor, mask: torch.Tensor, *, max_len: int,
                 global_tokens=None, global_seqs=None,
                 is_weights: Optional[torch.Tensor] = None) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """``(scalar loss, metrics)`` for one micro-batch; the metrics are detached 0-d tensors, read
    once at the end of the learner's step (``MetricAccumulator``), not one host sync per micro-batch.

    Args:
        algo: ``Config.algo``. logp: ``[B, C]`` with grad. old_logp: ``[B, C]`` ratio denominator.
        ref_logp: ``[B, C]`` KL target (the reference, or old_logp for ``kl_reference="old"``) or None
            (no KL term). advantages: ``[B]`` (weights for ``weighted_nll``). mask: ``[B, C]``.
        max_len: Dr. GRPO normaliser. global_tokens / global_seqs: whole-batch counts over all
            micro-batches and ranks (see ``grpo_dist.algo.aggregate``). is_weights: ``[B, C]`` rollout
            importance weights (``grpo_dist.algo.rollout_is_weights``) on the per-token policy loss, not
            on the KL term; None = no weighting (``algo.rollout_is: none``, bit for bit today's loss).

    ``loss == "clip"``: ``grpo_loss``. ``loss == "weighted_nll"``: the softmax-weighted variant's ``-w_i * logp`` per
    token, plus ``beta * kl_penalty`` when a KL target is given, aggregated with ``algo.agg``.
    """
    beta = algo.beta if ref_logp is not None else 0.0
    agg = dict(max_len=max_len, global_tokens=global_tokens, global_seqs=global_seqs)
    if algo.loss == "clip":
        return grpo_loss(logp, old_logp, ref_logp, advantages, mask, beta=beta, clip_low=algo.clip_low,
                         clip_high=algo.clip_high, dual_clip=algo.dual_clip, kl_kind=algo.kl_kind,
                         agg=algo.agg, ratio_level=algo.ratio_level, is_weights=is_weights,
                         tensor_metrics=True, **agg)
    per_token, metrics = weighted_nll_loss(logp, advantages, mask, tensor_metrics=True)
    m = mask.bool()
    if is_weights is not None:
        per_token = torch.where(m, per_token * is_weights.detach(), torch.zeros((), dtype=per_token.dtype))
    total, kl_term = per_token, None
    if ref_logp is not None:
        kl = torch.where(m, kl_penalty(logp, ref_logp, algo.kl_kind), torch.zeros((), dtype=logp.dtype))
        metrics["kl_mean"] = masked_mean(kl.detach(), m)
        if beta:
            kl_term = beta * kl
            total = per_token + kl_term
    loss = aggregate(total, mask, algo.agg, **agg)
    with torch.no_grad():
        metrics["loss"] = loss.detach()
        metrics["loss_policy"] = aggregate(per_token.detach(), mask, algo.agg, **agg)
        metrics["loss_kl"] = (aggregate(kl_term.detach(), mask, algo.agg, **agg) if kl_term is not None
                              else loss.new_zeros(()))
    return loss, metrics
