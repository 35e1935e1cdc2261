"""From scored groups to the learner's ``TrainBatch``: reward shaping, advantages, rollout metrics.

Pure functions (lists and tensors in, dataclasses and floats out): no Ray, no model.
"""

from __future__ import annotations

import math

import torch

from grpo_dist.algo import group_advantages, group_reward_stats, rloo_advantages, softmax_weights
from grpo_dist.config import AlgoConfig
from grpo_dist.types import TOOL_COUNTERS, RewardResult, RolloutGroup, TrainBatch


def compute_advantages(rewards: list[float], group_size: int, algo: AlgoConfig) -> list[float]:
    """Per-sequence advantages (or the softmax-weighted variant's weights) for contiguous groups."""
    r = torch.tensor(rewards, dtype=torch.float64)
    if algo.adv_estimator == "group":
        a = group_advantages(r, group_size, scale=algo.adv_scale, std_unbiased=algo.std_unbiased, eps=algo.adv_eps)
    elif algo.adv_estimator == "rloo":
        a = rloo_advantages(r, group_size)
    elif algo.adv_estimator == "softmax":
        a = softmax_weights(r, group_size, temperature=algo.softmax_temperature)
    else:  # pragma: no cover - the config forbids it
        raise ValueError(f"algo.adv_estimator: unknown {algo.adv_estimator!r}")
    return [float(x) for x in a]


def overlong_penalty(length: int, max_tokens: int, buffer_frac: float, penalty: float) -> float:
    """DAPO's soft overlong punishment: 0 up to ``max - buffer``, then linear down to ``-penalty``
    at ``max_tokens`` (and beyond)."""
    if buffer_frac <= 0:
        return 0.0
    buffer = max(1.0, buffer_frac * max_tokens)
    start = max_tokens - buffer
    if length <= start:
        return 0.0
    return -penalty * min(1.0, (length - start) / buffer)


def zero_spread(rewards: list[float]) -> bool:
    return max(rewards) - min(rewards) <= 1e-12


def build_batch(groups: list[RolloutGroup], scores: RewardResult, group_size: int, algo: AlgoConfig,
                max_tokens: int, all_tokens: bool = False) -> tuple[TrainBatch, dict[str, float]]:
    """Flatten groups (contiguous), shape rewards, compute advantages; also the rollout metrics.
    Overlong shaping compares ``max_tokens`` with the sampled tokens, or with every completion
    token (``all_tokens``: environment ones too); ``RolloutConfig.overlong_budget`` gives both."""
    rollouts = [r for g in groups for r in g.rollouts]
    if any(len(g.rollouts) != group_size for g in groups):
        raise ValueError(f"every group must hold group_size={group_size} completions")
    rewards = list(scores.total)
    shaping = [overlong_penalty(len(r.completion_ids) if all_tokens else r.sampled_length, max_tokens,
                                algo.overlong_buffer, algo.overlong_penalty) for r in rollouts]
    shaped = [x + s for x, s in zip(rewards, shaping)]
    adv = compute_advantages(shaped, group_size, algo)
    # an agent trajectory's earlier segments (rollout.agent): samples of their own, after the groups, with its advantage
    extra = [(s, a) for r, a in zip(rollouts, adv) for s in (r.segments or [])]
    samples, adv = rollouts + [s for s, _ in extra], adv + [a for _, a in extra]
    masks = None  # all ones unless a trajectory holds environment tokens or truncated ones are masked
    if algo.mask_truncated or any(r.loss_mask is not None for r in samples):
        masks = [[0.0] * len(r.completion_ids) if algo.mask_truncated and r.cut_by_length
                 else [float(x) for x in r.loss_mask] if r.loss_mask is not None
                 else [1.0] * len(r.completion_ids) for r in samples]
    batch = TrainBatch(
        prompt_ids=[r.prompt_ids for r in samples],
        completion_ids=[r.completion_ids for r in samples],
        behaviour_logprobs=[r.logprobs for r in samples],
        advantages=adv, loss_mask=masks,
        adapter_versions=[r.adapter_version for r in samples],
    )
    metrics = rollout_metrics(rollouts, rewards, scores, group_size)
    if any(r.segments is not None or "agent_segments" in r.columns for r in rollouts):
        metrics["rollout/agent_segments"] = float(len(extra))  # segments beyond each trajectory's first
        metrics["rollout/agent_segments_mean"] = (len(extra) + len(rollouts)) / len(rollouts)
    if algo.overlong_buffer > 0:
        metrics["rollout/overlong_penalty_mean"] = sum(shaping) / len(shaping)
    metrics["rollout/advantage_abs_mean"] = sum(abs(a) for a in adv) / len(adv)
    return batch, metrics


def staleness_metrics(versions: list[int], learner_version: int, max_staleness: int) -> dict[str, float]:
    """How many adapter versions each sample is behind the learner that trains on it: the mean
    (``rollout/staleness``, ``rollout/staleness_mean``), the max and a count per value
    (``rollout/staleness_count/<s>``). Raises ValueError past ``max_staleness`` or for a sample
    newer than the learner (a bookkeeping bug either way)."""
    stale = [learner_version - v for v in versions]
    if stale and (max(stale) > max_staleness or min(stale) < 0):
        raise ValueError(f"samples of adapter versions {sorted(set(versions))} for learner version {learner_version}: "
                         f"staleness must lie in [0, {max_staleness}] (trainer.max_staleness)")
    mean = sum(stale) / max(1, len(stale))
    m = {"rollout/staleness": mean, "rollout/staleness_mean": mean, "rollout/staleness_max": float(max(stale, default=0))}
    for s in sorted(set(stale)):
        m[f"rollout/staleness_count/{s}"] = float(stale.count(s))
    return m


def token_version_metrics(groups: list[RolloutGroup], learner_version: int) -> dict[str, float]:
    """Per-token versions (in-flight loads, ``Rollout.token_versions``): the fraction of samples
    whose sampled tokens come from two versions or more (``rollout/mixed_version_frac``) and how
    many versions each sampled token is behind the learner (``rollout/token_staleness_mean`` /
    ``_max``). Empty when no sample carries per-token versions."""
    rollouts = [r for g in groups for r in g.rollouts]
    if not any(r.token_versions is not None for r in rollouts):
        return {}
    per = [r.sampled_versions for r in rollouts]
    stale = [learner_version - v for vs in per for v in vs]
    return {"rollout/mixed_version_frac": sum(len(set(vs)) > 1 for vs in per) / max(1, len(per)),
            "rollout/token_staleness_mean": sum(stale) / max(1, len(stale)),
            "rollout/token_staleness_max": float(max(stale, default=0))}


def rollout_metrics(rollouts, rewards: list[float], scores: RewardResult, group_size: int) -> dict[str, float]:
    stats = group_reward_stats(torch.tensor(rewards, dtype=torch.float64), group_size)
    lengths = [len(r.completion_ids) for r in rollouts]
    m = {
        "rollout/reward_mean": stats["reward_mean"],
        "rollout/reward_std": stats["reward_std"],
        "rollout/frac_reward_zero_std": stats["frac_reward_zero_std"],
        "rollout/completion_length_mean": sum(lengths) / len(lengths),
        "rollout/completion_length_max": float(max(lengths)),
        "rollout/truncated_frac": sum(r.truncated for r in rollouts) / len(rollouts),
        "rollout/num_completions": float(len(rollouts)),
    }
    if any(r.loss_mask is not None for r in rollouts):
        m.update(trajectory_metrics(rollouts, lengths))
    for name, values in scores.per_function.items():
        finite = [v for v in values if v is not None and math.isfinite(v)]
        m[f"reward/{name}"] = sum(finite) / max(1, len(finite))
    for name, count in scores.errors.items():
        m[f"reward/errors/{name}"] = float(count)
    return m


def trajectory_metrics(rollouts, lengths: list[int]) -> dict[str, float]:
    """Multi-turn: turns, tool calls / errors / timeouts (totals and per trajectory), why the
    trajectories stopped (counts), the fraction of completion tokens with loss mask 0
    (``env_token_frac``), the sampled tokens per trajectory, the environment's reward and the
    sanity check's mismatches where present."""
    n = len(rollouts)
    masked = sum(len(r.loss_mask) - sum(r.loss_mask) for r in rollouts if r.loss_mask is not None)
    m = {"rollout/turns_mean": sum(r.turns for r in rollouts) / n,
         "rollout/turns_max": float(max(r.turns for r in rollouts)),
         "rollout/env_token_frac": masked / max(1, sum(lengths)),
         "rollout/sampled_length_mean": (sum(lengths) - masked) / n}
    for reason in sorted({r.stop_reason for r in rollouts if r.stop_reason}):
        m[f"rollout/stop_reason/{reason}"] = float(sum(r.stop_reason == reason for r in rollouts))
    for key in TOOL_COUNTERS:
        if any(key in r.columns for r in rollouts):
            total = float(sum(r.columns.get(key) or 0 for r in rollouts))
            m[f"rollout/{key}"], m[f"rollout/{key}_mean"] = total, total / n
    if "rollout/tool_calls" in m:
        m["rollout/tool_error_frac"] = m.get("rollout/tool_errors", 0.0) / max(1.0, m["rollout/tool_calls"])
    env = [r.columns.get("env_reward") for r in rollouts if r.columns.get("env_reward") is not None]
    if env:
        m["rollout/env_reward_mean"] = sum(env) / len(env)
    diffs = [r.columns["env_sanity_diff"] for r in rollouts if "env_sanity_diff" in r.columns]
    if diffs:
        m["rollout/env_sanity_diff_frac"] = sum(d >= 0 for d in diffs) / len(diffs)
    return m
