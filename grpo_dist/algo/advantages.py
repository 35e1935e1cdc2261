"""Advantages from group rewards: pure functions of ``rewards[N]`` and the group size ``G``.

Groups are contiguous blocks: ``rewards.view(-1, G)`` row ``g`` holds the ``G`` completions of
prompt ``g``. A group whose rewards are all equal carries no learning signal: every function
here gives it exactly zero advantage (and uniform softmax weights), never NaN.
"""

from __future__ import annotations

from typing import Dict

import torch

__all__ = [
    "group_advantages",
    "rloo_advantages",
    "softmax_weights",
    "group_reward_stats",
]

_SCALES = ("group", "batch", "none")


def _grouped(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """Validate and return ``rewards`` as a floating ``[N // G, G]`` view."""
    if not isinstance(rewards, torch.Tensor):
        rewards = torch.as_tensor(rewards)
    if rewards.dim() != 1:
        raise ValueError(f"rewards must be 1-D [N], got shape {tuple(rewards.shape)}")
    if isinstance(group_size, bool) or int(group_size) != group_size:
        raise ValueError(f"group_size must be an integer, got {group_size!r}")
    group_size = int(group_size)
    if group_size < 2:
        raise ValueError(f"group_size must be >= 2 (GRPO compares completions within a group), got {group_size}")
    n = rewards.shape[0]
    if n % group_size != 0:
        raise ValueError(
            f"number of rewards ({n}) is not a multiple of group_size ({group_size}); "
            "groups are contiguous blocks rewards.view(-1, group_size)"
        )
    if not rewards.is_floating_point():
        rewards = rewards.to(torch.float32)
    if not bool(torch.isfinite(rewards).all()):
        raise ValueError("rewards contain NaN or inf; reward functions must return finite scores")
    return rewards.view(-1, group_size)


def _zero_spread(grouped: torch.Tensor) -> torch.Tensor:
    """``[N//G, 1]`` bool: groups whose rewards are all equal."""
    return (grouped.amax(dim=1, keepdim=True) == grouped.amin(dim=1, keepdim=True))


def group_advantages(
    rewards: torch.Tensor,
    group_size: int,
    *,
    scale: str = "group",
    std_unbiased: bool = True,
    eps: float = 1e-4,
) -> torch.Tensor:
    """Group-relative advantages ``(r_i - mean_group) / (std + eps)``.

    Args:
        rewards: ``[N]`` rewards, ``N = num_prompts * G``, groups contiguous.
        group_size: ``G >= 2``.
        scale: ``"group"``: divide by the std of the group (DeepSeekMath / TRL);
            ``"batch"``: divide by the std of all ``N`` raw rewards;
            ``"none"``: mean-centre only (Dr. GRPO).
        std_unbiased: Bessel-corrected std (``torch.std`` default, TRL) when True; population
            std when False (the ``seed_notebook`` preset: ``unbiased=False`` with eps 1e-8).
        eps: added to the std before dividing (TRL 1e-4, verl 1e-6).

    Returns:
        ``[N]`` advantages, same floating dtype as ``rewards`` (float32 for integer rewards).
        Groups with equal rewards get exactly 0.

    Example: rewards ``[1,1,1,1,0,0,0,0]``, G=8 -> +-0.935 (unbiased std 0.5345),
    or +-1.0 with ``std_unbiased=False, eps=1e-8``.
    """
    if scale not in _SCALES:
        raise ValueError(f"unknown advantage scale {scale!r}; expected one of {_SCALES}")
    if eps < 0:
        raise ValueError(f"eps must be >= 0, got {eps}")
    grouped = _grouped(rewards, group_size)
    correction = 1 if std_unbiased else 0
    centred = grouped - grouped.mean(dim=1, keepdim=True)
    if scale == "group":
        std = grouped.std(dim=1, keepdim=True, correction=correction)
        adv = centred / (std + eps)
    elif scale == "batch":
        flat = grouped.reshape(-1)
        if flat.numel() <= correction:
            std = torch.zeros((), dtype=flat.dtype, device=flat.device)
        else:
            std = flat.std(correction=correction)
        adv = centred / (std + eps)
    else:
        adv = centred
    adv = torch.where(_zero_spread(grouped), torch.zeros_like(adv), adv)
    return adv.reshape(-1)


def rloo_advantages(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """REINFORCE leave-one-out advantages ``r_i - mean_{j != i} r_j`` within each group.

    Args:
        rewards: ``[N]``, groups contiguous. group_size: ``G >= 2``.

    Returns:
        ``[N]``; equals ``G / (G - 1) * (r_i - mean_group)``; equal-reward groups give 0.
    """
    grouped = _grouped(rewards, group_size)
    g = grouped.shape[1]
    baseline = (grouped.sum(dim=1, keepdim=True) - grouped) / (g - 1)
    adv = grouped - baseline
    adv = torch.where(_zero_spread(grouped), torch.zeros_like(adv), adv)
    return adv.reshape(-1)


def softmax_weights(rewards: torch.Tensor, group_size: int, temperature: float = 1.0) -> torch.Tensor:
    """The group-wise softmax-weighted variant's weights: ``softmax(r / temperature)`` within each contiguous group.

    Args:
        rewards: ``[N]``, groups contiguous. group_size: ``G >= 2``.
        temperature: ``> 0``; small temperatures approach a one-hot on the best completion,
            large ones approach uniform ``1 / G``.

    Returns:
        ``[N]`` non-negative weights summing to 1 in every group (uniform for equal rewards).
    """
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    grouped = _grouped(rewards, group_size)
    return torch.softmax(grouped / temperature, dim=1).reshape(-1)


def group_reward_stats(rewards: torch.Tensor, group_size: int) -> Dict[str, float]:
    """Plain-float reward statistics for logging (``reward/...`` namespace).

    Args:
        rewards: ``[N]``, groups contiguous. group_size: ``G >= 2``.

    Returns:
        ``reward_mean``: mean of all rewards; ``reward_std``: std (unbiased, 0 when N == 1) of
        all rewards in the batch; ``reward_group_std_mean``: mean over groups of the unbiased
        within-group std (TRL's ``reward_std``); ``frac_reward_zero_std``: fraction of groups
        whose rewards are all equal (they contribute no GRPO gradient).
    """
    grouped = _grouped(rewards, group_size).detach().double()
    flat = grouped.reshape(-1)
    if flat.numel() == 0:
        return {"reward_mean": 0.0, "reward_std": 0.0, "reward_group_std_mean": 0.0, "frac_reward_zero_std": 0.0}
    return {
        "reward_mean": float(flat.mean()),
        "reward_std": float(flat.std()) if flat.numel() > 1 else 0.0,
        "reward_group_std_mean": float(grouped.std(dim=1).mean()),
        "frac_reward_zero_std": float(_zero_spread(grouped).double().mean()),
    }
