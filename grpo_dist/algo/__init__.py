"""Pure tensor math of GRPO: no model, no Ray, no config object.

Shapes: ``B`` rows (completions), ``T`` tokens, ``V`` vocabulary, ``N`` rewards, ``G`` group size.
"""

from .advantages import group_advantages, group_reward_stats, rloo_advantages, softmax_weights
from .kl import KL_KINDS, kl_penalty, naive_kl
from .logprobs import entropy_from_logits, selective_log_softmax
from .losses import AGG_MODES, aggregate, grpo_loss, policy_loss, weighted_nll_loss
from .metrics import masked_mean, masked_sum, pass_at_k, quantile
from .rollout_is import IS_LEVELS, IS_MODES, rollout_is_weights

__all__ = [
    "AGG_MODES",
    "IS_LEVELS",
    "IS_MODES",
    "KL_KINDS",
    "aggregate",
    "entropy_from_logits",
    "group_advantages",
    "group_reward_stats",
    "grpo_loss",
    "kl_penalty",
    "masked_mean",
    "masked_sum",
    "naive_kl",
    "pass_at_k",
    "policy_loss",
    "quantile",
    "rloo_advantages",
    "rollout_is_weights",
    "selective_log_softmax",
    "softmax_weights",
    "weighted_nll_loss",
]
