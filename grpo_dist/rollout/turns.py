"""Multi-turn trajectories in the batch rollout worker (``rollout.env`` other than single_turn).

Token in, token out: a trajectory is its prompt ids, then per turn the ids the engine sampled
(kept as they came, with their behaviour log-probs, loss mask 1, the end-of-turn token
included), then the environment's answer appended as the tokens the chat template adds for
those messages (``grpo_dist.envs.chat.MessageEncoder``: loss mask 0, log-prob 0.0). The history
is never decoded and re-encoded; the text an environment reads is decoded from the turn's own
sampled ids (so a stop string such as ``</tool_call>`` is in it).

Turns run in lock step: each round generates one turn for every trajectory still going (one
engine call per distinct token limit and stop set), then runs every environment's ``step``
concurrently on the environments' event loop. A trajectory stops (``stop_reason``) when its
environment says ``done``; else, cut by a limit (``truncated``, ``finish_reason`` "length"):

* ``length``: a turn used all of ``rollout.max_tokens``;
* ``budget``: ``rollout.max_total_tokens`` (completion tokens over all turns, environment tokens
  included -- TRL's ``max_completion_length``) ran out;
* ``max_turns``: ``rollout.max_turns`` turns ran and the environment wanted more;
* ``context``: the next turn would not fit in ``model.max_model_len``;
* ``timeout``: ``rollout.trajectory_timeout_s`` of wall clock passed (checked before each turn
  and bounding each ``step``);
* ``env_error``: the environment's ``reset``/``step`` raised (logged with its traceback once).

Tool results longer than ``rollout.max_tool_result_tokens`` are cut in the middle. The stop
reason, ``truncated``, the turn count, the summed ``info`` counters (tool_calls, tool_errors,
...) and the environment's reward (``env_reward``: the sum of its step rewards, or what
``finish`` returned) become columns of the Rollout, so reward functions and metrics see them.
``rollout.env_sanity`` re-renders every trajectory in full and records the first index where
the built ids differ (column ``env_sanity_diff``, -1 if none; a warning names the tokens).
"""

from __future__ import annotations

import asyncio
import logging
import time
import traceback
from dataclasses import dataclass, field
from typing import Any

from grpo_dist.envs.base import COUNTERS, Env, EnvLimits, EnvStep, acall, run
from grpo_dist.envs.registry import EnvSource
from grpo_dist.envs.chat import (MessageEncoder, cap_tool_messages, encode_opening, first_difference, has_template,
                                 opening_messages, render)
from grpo_dist.rollout.base import Generator, SamplingSpec
from grpo_dist.types import Rollout, RolloutGroup

log = logging.getLogger("grpo_dist.rollout")
_MASK63 = (1 << 63) - 1
_ENCODERS: dict[int, MessageEncoder] = {}
_WARNED: set[str] = set()


@dataclass
class Trajectory:
    record: Any
    prompt_ids: list[int]
    seed: int | None
    env: Env
    messages: list[dict[str, Any]] | None  # the conversation so far (None: the record's rendered prompt)
    started: float = field(default_factory=time.monotonic)
    ids: list[int] = field(default_factory=list)  # everything after the prompt
    logprobs: list[float] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    turns: int = 0
    stop_reason: str | None = None
    counters: dict[str, float] = field(default_factory=lambda: {k: 0.0 for k in COUNTERS})
    reward: float | None = None
    sanity_diff: int | None = None
    tools: list[dict[str, Any]] | None = None  # schemas the opening passed through the template's tools=

    def add(self, ids: list[int], logprobs: list[float] | None) -> None:
        self.ids += ids
        self.logprobs += logprobs if logprobs is not None else [0.0] * len(ids)
        self.mask += [1 if logprobs is not None else 0] * len(ids)

    def note(self, step: EnvStep) -> None:
        for k in COUNTERS:
            v = step.info.get(k)
            if isinstance(v, (int, float)):
                self.counters[k] += float(v)
        if step.reward is not None:
            self.reward = (self.reward or 0.0) + float(step.reward)


def encoder_for(tokenizer: Any) -> MessageEncoder:
    """One encoder per tokenizer (its template checked once: TemplateError if unusable)."""
    enc = _ENCODERS.get(id(tokenizer))
    if enc is None or enc.tok is not tokenizer:
        enc = _ENCODERS[id(tokenizer)] = MessageEncoder(tokenizer)
    return enc


def turn_seed(seed: int | None, turn: int) -> int | None:
    """Turn 0 samples with the sample's own seed (a one-turn trajectory is today's completion);
    later turns with seeds derived from it."""
    if seed is None or turn == 0:
        return seed
    return (seed * 6364136223846793005 + turn * 1442695040888963407) & _MASK63


def run_trajectories(engine: Generator, records: list[Any], prompt_ids: list[list[int]], spec: SamplingSpec,
                     seeds: list[list[int]] | None, source: EnvSource, max_model_len: int,
                     version: int) -> list[RolloutGroup]:
    """``spec.n`` trajectories per record (seeds[i][j]: trajectory j of record i)."""
    tok, lim = engine.tokenizer, source.limits
    encode = encoder_for(tok)
    groups = _start(tok, records, prompt_ids, spec.n, seeds, source)
    active = [t for g in groups for t in g if t.stop_reason is None]
    while active:
        for t in active:
            if _expired(t, lim):
                t.stop_reason = "timeout"
        active = [t for t in active if t.stop_reason is None]
        texts = _generate(engine, active, spec, lim, max_model_len)
        answers = run(_step_all(active, texts, lim))
        still = []
        for t, (cut, _, said), answer in zip(active, texts, answers):
            if isinstance(answer, EnvStep):
                t.note(answer)
            t.stop_reason = _why_stop(t, cut, answer, lim)
            if t.stop_reason is None:
                msgs, n_cut = cap_tool_messages(tok, answer.messages, lim.max_tool_result_tokens)
                t.counters["tool_truncated"] += n_cut
                extra = encode(msgs, t.ids[-1] if t.ids else None)
                if lim.max_total_tokens is not None and len(t.ids) + len(extra) >= lim.max_total_tokens:
                    t.stop_reason = "budget"
                elif len(t.prompt_ids) + len(t.ids) + len(extra) >= max_model_len:
                    t.stop_reason = "context"
                else:
                    t.add(extra, None)
                    if t.messages is not None:
                        t.messages += [{"role": "assistant", "content": said}] + msgs
                    still.append(t)
        active = still
    run(_finish_all([t for g in groups for t in g], lim.tool_timeout_s))
    return [RolloutGroup(prompt_id=g[0].record.id, rollouts=[_rollout(tok, t, version, lim.sanity) for t in g])
            for g in groups]


def _start(tok, records, prompt_ids, n, seeds, source: EnvSource) -> list[list[Trajectory]]:
    envs = [[source.make(rec) for _ in range(n)] for rec in records]
    openings = run(_gather([_reset(e, rec) for rec, row in zip(records, envs) for e in row]))
    groups, k = [], 0
    for i, (rec, pids) in enumerate(zip(records, prompt_ids)):
        trajs = []
        for j, env in enumerate(envs[i]):
            opening, k = openings[k], k + 1
            seed = seeds[i][j] if seeds is not None else None
            if isinstance(opening, BaseException):
                t = Trajectory(rec, list(pids), seed, env, None, stop_reason="env_error")
            elif opening is None:
                t = Trajectory(rec, list(pids), seed, env, None)
            else:
                schemas, parser = getattr(env, "tools", None), getattr(env, "parser", None)
                ids = encode_opening(tok, opening, schemas, parser)
                msgs, tools = opening_messages(tok, opening, schemas, parser) if has_template(tok) else (None, None)
                t = Trajectory(rec, ids, seed, env, msgs, tools=tools)
            trajs.append(t)
        groups.append(trajs)
    return groups


async def _gather(coros: list) -> list:
    return list(await asyncio.gather(*coros))


async def _reset(env: Env, record: Any):
    try:
        return await acall(env.reset, record)
    except Exception as e:  # noqa: BLE001 - the trajectory ends as env_error, the run goes on
        _warn_once("reset", f"environment {type(env).__name__}.reset raised: {traceback.format_exc()}")
        return e


def _expired(t: Trajectory, lim: EnvLimits) -> bool:
    return lim.trajectory_timeout_s is not None and time.monotonic() - t.started >= lim.trajectory_timeout_s


def _turn_limit(t: Trajectory, spec: SamplingSpec, lim: EnvLimits, max_model_len: int) -> int:
    m = min(spec.max_tokens, max_model_len - len(t.prompt_ids) - len(t.ids))
    if lim.max_total_tokens is not None:
        m = min(m, lim.max_total_tokens - len(t.ids))
    return max(1, m)


def _generate(engine: Generator, active: list[Trajectory], spec: SamplingSpec, lim: EnvLimits,
              max_model_len: int) -> list[tuple[str | None, str, str]]:
    """One turn for every trajectory; returns, each: why the turn was cut (or None), its text for
    the environment (special tokens skipped), its text as the conversation holds it (only the
    end-of-turn token left out: what a faithful re-render of the history would put there)."""
    tok = engine.tokenizer
    batches: dict[tuple, list[int]] = {}
    for i, t in enumerate(active):
        stop = tuple(dict.fromkeys(list(spec.stop) + list(getattr(t.env, "stop", None) or [])))
        batches.setdefault((_turn_limit(t, spec, lim, max_model_len), stop), []).append(i)
    out: list[Any] = [None] * len(active)
    for (m, stop), idx in batches.items():
        one = SamplingSpec(n=1, temperature=spec.temperature, top_p=spec.top_p, top_k=spec.top_k, max_tokens=m,
                           stop=list(stop))
        ts = [active[i] for i in idx]
        seeds = None if any(t.seed is None for t in ts) else [[turn_seed(t.seed, t.turns)] for t in ts]
        samples = engine.generate([t.prompt_ids + t.ids for t in ts], one, seeds=seeds)
        for i, t, (s,) in zip(idx, ts, samples):
            t.add(list(s.token_ids), list(s.logprobs))
            t.turns += 1
            cut = None
            if s.finish_reason == "length":
                cut = ("length" if m == spec.max_tokens else
                       "budget" if lim.max_total_tokens is not None and len(t.ids) >= lim.max_total_tokens
                       else "context")
            out[i] = (cut, tok.decode(s.token_ids, skip_special_tokens=True), _said(tok, s.token_ids))
    return out


async def _step_all(active: list[Trajectory], texts, lim: EnvLimits) -> list[Any]:
    return await asyncio.gather(*(_step(t, text, lim) for t, (_, text, _) in zip(active, texts)))


async def _step(t: Trajectory, text: str, lim: EnvLimits) -> Any:
    """The environment's answer; "timeout" past the trajectory's wall clock; "env_error"."""
    left = None if lim.trajectory_timeout_s is None else max(0.0, lim.trajectory_timeout_s - (time.monotonic() - t.started))
    try:
        return await asyncio.wait_for(acall(t.env.step, text), left)
    except asyncio.TimeoutError:
        return "timeout"
    except Exception:  # noqa: BLE001 - the trajectory ends as env_error, the run goes on
        _warn_once("step", f"environment {type(t.env).__name__}.step raised: {traceback.format_exc()}")
        return "env_error"


def _why_stop(t: Trajectory, cut: str | None, answer: Any, lim: EnvLimits) -> str | None:
    if isinstance(answer, str):
        return answer
    if answer.done:
        return "done"
    if cut is not None:
        return cut
    if t.turns >= lim.max_turns:
        return "max_turns"
    return None


async def _finish_all(trajs: list[Trajectory], timeout: float | None) -> None:
    async def one(t: Trajectory) -> None:
        fin = getattr(t.env, "finish", None)
        if fin is None:
            return
        try:
            r = await asyncio.wait_for(acall(fin, t.stop_reason), timeout)
        except Exception:  # noqa: BLE001
            _warn_once("finish", f"environment {type(t.env).__name__}.finish raised: {traceback.format_exc()}")
            return
        if r is not None:
            t.reward = float(r)

    await asyncio.gather(*(one(t) for t in trajs))


def _rollout(tok: Any, t: Trajectory, version: int, sanity: bool) -> Rollout:
    if sanity:
        t.sanity_diff = _sanity(tok, t)
    cols = dict(t.record.columns)
    cols.update(stop_reason=t.stop_reason, truncated=t.stop_reason != "done", turns=t.turns, env_reward=t.reward,
                **{k: int(v) for k, v in t.counters.items()})
    if t.sanity_diff is not None:
        cols["env_sanity_diff"] = t.sanity_diff
    return Rollout(prompt_id=t.record.id, prompt=t.record.prompt, prompt_ids=t.prompt_ids,
                   completion=tok.decode(t.ids, skip_special_tokens=True), completion_ids=t.ids,
                   logprobs=t.logprobs, finish_reason="stop" if t.stop_reason == "done" else "length",
                   adapter_version=version, columns=cols, loss_mask=t.mask, turns=t.turns, stop_reason=t.stop_reason)


def _sanity(tok: Any, t: Trajectory) -> int:
    """First index where prompt + built ids differ from a full re-render (-1: none): the whole
    conversation through the chat template where the environment opened it, else the decoded text
    tokenized again."""
    built = t.prompt_ids + t.ids
    if t.messages is not None:
        msgs = list(t.messages)
        if t.mask and t.mask[-1] == 1:  # the last turn, not followed by environment messages yet
            last = len(t.mask) - t.mask[::-1].index(0) if 0 in t.mask else 0
            msgs.append({"role": "assistant", "content": _said(tok, t.ids[last:])})
        text = render(tok, msgs, tools=t.tools)
        ref = tok(text, add_special_tokens=False)["input_ids"]
    else:
        ref = tok(tok.decode(built, skip_special_tokens=False), add_special_tokens=False)["input_ids"]
    at = first_difference(built, ref)
    if at >= 0:
        _warn_once("sanity", f"rollout.env_sanity: built ids differ from a full re-render at token {at} of "
                   f"{len(built)}: built {tok.decode(built[at:at + 5])!r} vs re-rendered {tok.decode(ref[at:at + 5])!r} "
                   f"(the re-render would train on other tokens than the ones sampled)")
    return at


def _said(tok: Any, ids: list[int]) -> str:
    eos = getattr(tok, "eos_token_id", None)
    return tok.decode(ids[:-1] if ids and ids[-1] == eos else ids)


def _warn_once(key: str, msg: str) -> None:
    if key not in _WARNED:
        _WARNED.add(key)
        log.warning(msg)
