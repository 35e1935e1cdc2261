"""Multi-turn trajectories one coroutine each, on vLLM's async engine (``rollout.streaming`` with
an environment).

Each trajectory advances on its own: a turn is one engine request
(:meth:`AsyncVLLMGenerator.generate_group` with n=1 and the turn's seed), then its environment's
``step``, then the next request. The engine batches whatever requests are in flight, so a
trajectory waiting on a tool (or a long one) holds back no other. Ids, masks, limits, stop
reasons and columns are those of the lock-step loop (grpo_dist/rollout/trajectory.py): with the
same seeds, the same tokens. ``trajectory_timeout_s`` also bounds a turn's generation here. An
engine request that raised fails the group with its error, and the group's other trajectories
are cancelled (none is left waiting on a broken engine).

A trajectory keeps the version each turn ran with (``Rollout.weight_versions``: weights may change
between turns; each token's behaviour log-prob is that of the version that sampled it); its
``adapter_version`` is the oldest of them, the one staleness counts from.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from grpo_dist.envs.registry import EnvSource
from grpo_dist.rollout.base import SamplingSpec
from grpo_dist.rollout.trajectory import (Trajectory, encoder_for, expired, finish, open_trajectory, reset, step,
                                          to_rollout, turn_seed, turn_spec)
from grpo_dist.types import RolloutGroup, StopReason


async def run_group_async(engine: Any, record: Any, prompt_ids: list[int], spec: SamplingSpec,
                          seeds: list[int] | None, source: EnvSource, max_model_len: int,
                          min_version: int = 0) -> RolloutGroup:
    """``spec.n`` trajectories of ``record`` (``seeds[j]``: trajectory j's), concurrently."""
    tok = engine.tokenizer
    tasks = [asyncio.ensure_future(run_trajectory(engine, record, prompt_ids, spec, None if seeds is None else seeds[j],
                                                  source, max_model_len, min_version)) for j in range(spec.n)]
    try:
        done = await asyncio.gather(*tasks)
    except BaseException:  # an engine request raised: the group fails with it, its other trajectories end now
        for t in tasks:
            t.cancel()
        raise
    return RolloutGroup(prompt_id=record.id, rollouts=[to_rollout(tok, t, v, source.limits.sanity) for t, v in done])


async def run_trajectory(engine: Any, record: Any, prompt_ids: list[int], spec: SamplingSpec, seed: int | None,
                         source: EnvSource, max_model_len: int, min_version: int = 0) -> tuple[Trajectory, int]:
    """One trajectory to its end; returns it and the oldest adapter version its turns ran with."""
    tok, lim = engine.tokenizer, source.limits
    encode = encoder_for(tok)
    env = source.make(record)
    t = open_trajectory(tok, record, prompt_ids, seed, env, await reset(env, record))
    while t.stop_reason is None:
        if expired(t, lim):
            t.stop_reason = StopReason.TIMEOUT
            break
        one = turn_spec(t, spec, lim, max_model_len)
        if one is None:  # no room for a token: stop_reason context / budget
            break
        left = None if lim.trajectory_timeout_s is None else lim.trajectory_timeout_s - (time.monotonic() - t.started)
        try:
            samples, version = await asyncio.wait_for(
                engine.generate_group(t.prompt_ids + t.ids, one, None if t.seed is None else [turn_seed(t.seed, t.turns)],
                                      min_version), left)
        except asyncio.TimeoutError:  # the request is cancelled (vLLM aborts it)
            t.stop_reason = StopReason.TIMEOUT
            break
        cut, text = t.take(samples[0], one.max_tokens, spec, lim, tok, version)
        t.advance(cut, text, await step(t, text, lim), lim, tok, encode, max_model_len)
    await finish(t, lim.tool_timeout_s)
    return t, min(t.versions, default=int(getattr(engine, "version", 0)))
