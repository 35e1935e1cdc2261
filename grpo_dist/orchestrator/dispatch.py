"""Sharding work over actor groups and merging the results back in order.

Training generation goes through ``grpo_dist.orchestrator.pipeline`` (chunks to the least-loaded engine,
:func:`chunk_bounds` / :func:`assign_chunks` / :func:`merge_in_order`); evaluation uses the
static shards of :func:`generate`."""

from __future__ import annotations

from typing import Any

from grpo_dist.cluster.ray_utils import ActorGroup
from grpo_dist.reward.worker import score_inputs
from grpo_dist.types import RewardResult, RolloutGroup


def split(items: list[Any], parts: int) -> list[list[Any]]:
    """``parts`` contiguous shards whose sizes differ by at most one. With fewer items than parts
    some shards are empty (not only the last ones); the callers send nothing to those ranks."""
    n = len(items)
    return [items[n * i // parts: n * (i + 1) // parts] for i in range(parts)]


def chunk_bounds(n: int, engines: int, chunk: int = 0) -> list[tuple[int, int]]:
    """Contiguous ``(lo, hi)`` prompt ranges of one batch: ``chunk`` prompts each (the last one
    shorter), or with ``chunk == 0`` one range per engine as :func:`split` cuts them. Never empty."""
    if chunk <= 0:
        bounds = [(n * i // engines, n * (i + 1) // engines) for i in range(engines)]
    else:
        bounds = [(lo, min(n, lo + chunk)) for lo in range(0, n, chunk)]
    return [(lo, hi) for lo, hi in bounds if hi > lo]


def assign_chunks(sizes: list[int], outstanding: list[int]) -> list[int]:
    """The engine of each chunk, in order: the one with the fewest outstanding prompts (ties: the
    lowest rank), counting the chunks assigned before it. A slow engine, still busy with earlier
    work, gets less. ``outstanding`` is not modified."""
    load = list(outstanding)
    ranks = []
    for size in sizes:
        r = min(range(len(load)), key=lambda i: (load[i], i))
        ranks.append(r)
        load[r] += size
    return ranks


def merge_in_order(parts: list[tuple[int, list[Any]]]) -> list[Any]:
    """Chunk results ``(lo, groups)`` from whichever engines ran them, back in prompt order."""
    return [g for _, part in sorted(parts, key=lambda x: x[0]) for g in part]


def submit_generate(rollout: ActorGroup, records: list[Any], **kwargs) -> list[tuple[int, Any]]:
    """Start generating (prompts sharded over the rollout workers); returns ``(rank, Ray ref)``
    pairs.

    Each actor runs its calls in order, so a weight update submitted after this call is applied
    after this generation (the rollouts keep the version they were started with)."""
    shards = split(records, len(rollout))
    keys = kwargs.pop("keys", None)  # per-prompt sampling-seed keys travel with their prompts
    if keys is not None:
        return [(i, a.generate.remote(s, keys=k, **kwargs))
                for i, (a, s, k) in enumerate(zip(rollout.actors, shards, split(keys, len(rollout)))) if s]
    return [(i, a.generate.remote(s, **kwargs)) for i, (a, s) in enumerate(zip(rollout.actors, shards)) if s]


def collect_generate(rollout: ActorGroup, pending: list[tuple[int, Any]],
                     timeout: float | None = None) -> list[RolloutGroup]:
    """Wait for :func:`submit_generate`'s refs (a worker silent past ``timeout`` seconds raises a
    ClusterError marked ``hung``); groups come back in prompt order."""
    parts = rollout.get([r for _, r in pending], timeout=timeout, ranks=[i for i, _ in pending])
    return [g for part in parts for g in part]


def generate(rollout: ActorGroup, records: list[Any], timeout: float | None = None, **kwargs) -> list[RolloutGroup]:
    """Prompts sharded over the rollout workers; groups come back in prompt order."""
    return collect_generate(rollout, submit_generate(rollout, records, **kwargs), timeout)


def score(reward: ActorGroup, groups: list[RolloutGroup], functions: list[str] | None = None) -> RewardResult:
    """Completions (flattened, groups contiguous) sharded over the reward workers (``functions``:
    only these reward names; None = all)."""
    flat = [r for g in groups for r in g.rollouts]
    shards = split(flat, len(reward))
    refs, ranks = [], []
    for i, (a, s) in enumerate(zip(reward.actors, shards)):
        if not s:
            continue
        ranks.append(i)
        refs.append(a.score.remote(*score_inputs(s), functions))
    return merge_scores(reward.get(refs, ranks=ranks))


def merge_scores(parts: list[RewardResult]) -> RewardResult:
    """Reward results of consecutive completions as one (tracebacks: the first of each function)."""
    total, per_fn, errors, tracebacks, reasons = [], {}, {}, {}, {}
    for p in parts:
        total.extend(p.total)
        for k, v in getattr(p, "tracebacks", {}).items():
            tracebacks.setdefault(k, v)
        for k, v in getattr(p, "reasons", {}).items():
            reasons.setdefault(k, v)
        for k, v in p.per_function.items():
            per_fn.setdefault(k, []).extend(v)
        for k, v in p.errors.items():
            errors[k] = errors.get(k, 0) + v
    return RewardResult(total=total, per_function=per_fn, errors=errors, tracebacks=tracebacks, reasons=reasons)
