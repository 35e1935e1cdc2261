"""Multi-turn trajectories in the batch rollout worker (``rollout.env`` other than single_turn).

Token in, token out: a trajectory is its prompt ids, then per turn the ids the engine sampled
(kept as they came, with their behaviour log-probs, loss mask 1, the end-of-turn token
included), then the environment's answer appended as the tokens the chat template adds for
those messages (``grpo_dist.envs.chat.MessageEncoder``: loss mask 0, log-prob 0.0). The history
is never decoded and re-encoded; the text an environment reads is decoded from the turn's own
sampled ids (so a stop string such as ``</tool_call>`` is in it).

Turns run in lock step: each round generates one turn for every trajectory still going (one
engine call per distinct token limit and stop set), then runs every environment's ``step``
concurrently on the environments' event loop (also for a turn cut by a limit: the environment may
score it). A trajectory stops (``stop_reason``) when its environment says ``done`` after a turn
that ended by itself; else it is cut by a limit (``truncated``, ``finish_reason`` "length"):

* ``length``: a turn used all of ``rollout.max_tokens``;
* ``budget``: ``rollout.max_total_tokens`` (completion tokens over all turns, environment tokens
  included -- TRL's ``max_completion_length``) ran out;
* ``max_turns``: ``rollout.max_turns`` turns ran and the environment wanted more;
* ``context``: the next turn would not fit in ``model.max_model_len``;
* ``timeout``: ``rollout.trajectory_timeout_s`` of wall clock passed (checked before each turn
  and bounding each ``step``);
* ``env_error``: the environment's ``reset``/``step`` raised (logged with its traceback once; the
  Rollout's ``error`` names it; past ``rollout.max_env_error_rate`` the run stops);
* ``abort``: the engine aborted the turn's request.

(``grpo_dist.types.StopReason`` lists them.)

Tool results longer than ``rollout.max_tool_result_tokens`` are cut in the middle. The stop
reason, ``truncated``, the turn count, the summed ``info`` counters (tool_calls, tool_errors,
...) and the environment's reward (``env_reward``: the sum of its step rewards, or what
``finish`` returned) become columns of the Rollout, so reward functions and metrics see them.
``rollout.env_sanity`` re-renders every trajectory in full and records the first index where
the built ids differ (column ``env_sanity_diff``, -1 if none; a warning names the tokens).
"""

from __future__ import annotations

import asyncio
from typing import Any

from grpo_dist.envs.base import run
from grpo_dist.envs.registry import EnvSource
from grpo_dist.rollout.base import Generator, SamplingSpec, generate_each
from grpo_dist.rollout.trajectory import (Trajectory, encoder_for, expired, finish, open_trajectory, reset, step,
                                          to_rollout, turn_seed, turn_spec)
from grpo_dist.types import RolloutGroup, StopReason

__all__ = ["run_trajectories", "turn_seed"]


def run_trajectories(engine: Generator, records: list[Any], prompt_ids: list[list[int]], spec: SamplingSpec,
                     seeds: list[list[int]] | None, source: EnvSource, max_model_len: int,
                     version: int) -> list[RolloutGroup]:
    """``spec.n`` trajectories per record (seeds[i][j]: trajectory j of record i), in lock step."""
    tok, lim = engine.tokenizer, source.limits
    encode = encoder_for(tok)
    envs = [[source.make(rec) for _ in range(spec.n)] for rec in records]
    openings = iter(run(_gather([reset(e, rec) for rec, row in zip(records, envs) for e in row])))
    groups = [[open_trajectory(tok, rec, pids, seeds[i][j] if seeds is not None else None, env, next(openings))
               for j, env in enumerate(envs[i])] for i, (rec, pids) in enumerate(zip(records, prompt_ids))]
    active = [t for g in groups for t in g if t.stop_reason is None]
    while active:
        for t in active:
            if expired(t, lim):
                t.stop_reason = StopReason.TIMEOUT
        # None: no room for a token left (stop_reason context / budget set); no request is sent
        pairs = [(t, turn_spec(t, spec, lim, max_model_len)) for t in active if t.stop_reason is None]
        active, specs = [t for t, s in pairs if s is not None], [s for _, s in pairs if s is not None]
        turns = _generate(engine, active, specs, spec, lim, version)
        answers = run(_gather([step(t, text, lim) for t, (_, text) in zip(active, turns)]))
        active = [t for t, (cut, said), answer in zip(active, turns, answers)
                  if t.advance(cut, said, answer, lim, tok, encode, max_model_len)]
    run(_gather([finish(t, lim.tool_timeout_s) for g in groups for t in g]))
    return [RolloutGroup(prompt_id=g[0].record.id, rollouts=[to_rollout(tok, t, version, lim.sanity) for t in g])
            for g in groups]


async def _gather(coros: list) -> list:
    return list(await asyncio.gather(*coros))


def _generate(engine: Generator, active: list[Trajectory], specs: list[SamplingSpec], spec: SamplingSpec, lim,
              version: int) -> list:
    """One turn for every trajectory (``specs[i]``: trajectory i's; one engine call per distinct
    token limit and stop strings: :func:`~grpo_dist.rollout.base.generate_each`); returns
    ``Trajectory.take``'s answer for each."""
    seeds = [None if t.seed is None else turn_seed(t.seed, t.turns) for t in active]
    samples = generate_each(engine, [t.prompt_ids + t.ids for t in active], specs, seeds)
    return [t.take(s, one.max_tokens, spec, lim, engine.tokenizer, version) for t, s, one in zip(active, samples, specs)]
