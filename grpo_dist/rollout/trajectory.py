"""One multi-turn trajectory: its token pieces, its limits, its environment calls, its Rollout.

Shared by the lock-step loop (grpo_dist/rollout/turns.py, the batch worker) and the per-trajectory
loop (grpo_dist/rollout/turns_async.py, vLLM's async engine): the same ids, masks, stop reasons
and columns whichever loop ran it. See turns.py for the contract.
"""

from __future__ import annotations

import asyncio
import logging
import time
import traceback
from dataclasses import dataclass, field
from typing import Any

from grpo_dist.envs.base import Env, EnvLimits, EnvStep, acall
from grpo_dist.envs.chat import (MessageEncoder, cap_tool_messages, encode_opening, first_difference, has_template,
                                 opening_messages, render)
from grpo_dist.rollout.base import Sample, SamplingSpec
from grpo_dist.types import TOOL_COUNTERS, Rollout, StopReason

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
    counters: dict[str, float] = field(default_factory=lambda: {k: 0.0 for k in TOOL_COUNTERS})
    reward: float | None = None
    sanity_diff: int | None = None
    tools: list[dict[str, Any]] | None = None  # schemas the opening passed through the template's tools=
    transcript: list[dict[str, Any]] = field(default_factory=list)  # the turns after the prompt as text (W&B table)
    versions: list[int] = field(default_factory=list)  # the weight version each turn was sampled with
    error: str | None = None  # env_error: what the environment raised, one line
    # each token's weight version (in-flight loads: a turn may span two); environment tokens take the
    # version of the token before them. None until a sample carries versions
    token_versions: list[int] | None = None

    def add(self, ids: list[int], logprobs: list[float] | None, versions: list[int] | None = None) -> None:
        if versions is not None and self.token_versions is None:
            self.token_versions = [versions[0] if versions else 0] * len(self.ids)
        if self.token_versions is not None:
            self.token_versions += versions if versions is not None else \
                [self.token_versions[-1] if self.token_versions else 0] * len(ids)
        self.ids += ids
        self.logprobs += logprobs if logprobs is not None else [0.0] * len(ids)
        self.mask += [1 if logprobs is not None else 0] * len(ids)

    def note(self, step: EnvStep) -> None:
        for k in TOOL_COUNTERS:
            v = step.info.get(k)
            if isinstance(v, (int, float)):
                self.counters[k] += float(v)
        if step.reward is not None:
            self.reward = (self.reward or 0.0) + float(step.reward)

    def take(self, sample: Sample, m: int, spec: SamplingSpec, lim: EnvLimits, tok: Any,
             version: int = 0) -> tuple[str | None, str]:
        """Append a turn sampled with weights ``version`` (limit ``m``); returns why it was cut (or None) and its text, for
        the environment and the conversation alike: what the model wrote, special tokens included
        (a tool call may be written in them), only the end-of-turn token left out (what a faithful
        re-render of the history puts there)."""
        self.add(list(sample.token_ids), list(sample.logprobs), sample.versions)
        self.turns += 1
        self.versions.append(min(sample.versions) if sample.versions else int(version))
        text = said(tok, sample.token_ids)
        self.transcript.append({"role": "assistant", "content": text})
        cut = StopReason.ABORT if sample.finish_reason == "abort" else None
        if sample.finish_reason == "length":
            cut = (StopReason.LENGTH if m == spec.max_tokens else
                   StopReason.BUDGET if lim.max_total_tokens is not None and len(self.ids) >= lim.max_total_tokens
                   else StopReason.CONTEXT)
        return cut, text

    def advance(self, cut: str | None, said_text: str, answer: Any, lim: EnvLimits, tok: Any, encode: MessageEncoder,
                max_model_len: int) -> bool:
        """After the environment answered (an EnvStep, or "timeout" / "env_error"): set the stop
        reason, or append its messages as tokens (mask 0); True if the trajectory goes on."""
        if isinstance(answer, EnvStep):
            self.note(answer)
        self.stop_reason = why_stop(self, cut, answer, lim)
        if self.stop_reason is not None:
            return False
        msgs, n_cut = cap_tool_messages(tok, answer.messages, lim.max_tool_result_tokens)
        self.counters["tool_truncated"] += n_cut
        extra = encode(msgs, self.ids[-1] if self.ids else None)
        if lim.max_total_tokens is not None and len(self.ids) + len(extra) >= lim.max_total_tokens:
            self.stop_reason = StopReason.BUDGET
        elif len(self.prompt_ids) + len(self.ids) + len(extra) >= max_model_len:
            self.stop_reason = StopReason.CONTEXT
        else:
            self.add(extra, None)
            self.transcript += [dict(m) for m in msgs]
            if self.messages is not None:
                self.messages += [{"role": "assistant", "content": said_text}] + msgs
            return True
        return False


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


def open_trajectory(tok: Any, record: Any, prompt_ids: list[int], seed: int | None, env: Env,
                    opening: Any) -> Trajectory:
    """A trajectory from its environment's opening (None: the record's prompt ids; an exception:
    already ended as env_error)."""
    if isinstance(opening, BaseException):
        return Trajectory(record, list(prompt_ids), seed, env, None, stop_reason=StopReason.ENV_ERROR,
                          error=error_line(opening, f"{type(env).__name__}.reset"))
    if opening is None:
        return Trajectory(record, list(prompt_ids), seed, env, None)
    schemas, parser = getattr(env, "tools", None), getattr(env, "parser", None)
    ids = encode_opening(tok, opening, schemas, parser)
    msgs, tools = opening_messages(tok, opening, schemas, parser) if has_template(tok) else (None, None)
    return Trajectory(record, ids, seed, env, msgs, tools=tools)


def turn_spec(t: Trajectory, spec: SamplingSpec, lim: EnvLimits, max_model_len: int) -> SamplingSpec | None:
    """The next turn's sampling: ``rollout.max_tokens`` within the budget and the context, the
    stop strings plus the environment's (a parser's ``</tool_call>``). None when no token fits:
    the trajectory then ends (``context``: the context is full, e.g. an opening longer than the
    prompts pre-flight measured; ``budget``), and no request goes to the engine (vLLM refuses a
    prompt that fills ``max_model_len``, failing the whole batch with it)."""
    m = min(spec.max_tokens, max_model_len - len(t.prompt_ids) - len(t.ids))
    if m < 1:
        t.stop_reason = StopReason.CONTEXT
        return None
    if lim.max_total_tokens is not None:
        m = min(m, lim.max_total_tokens - len(t.ids))
        if m < 1:
            t.stop_reason = StopReason.BUDGET
            return None
    stop = list(dict.fromkeys(list(spec.stop) + list(getattr(t.env, "stop", None) or [])))
    return SamplingSpec(n=1, temperature=spec.temperature, top_p=spec.top_p, top_k=spec.top_k, max_tokens=m, stop=stop)


async def reset(env: Env, record: Any):
    try:
        return await acall(env.reset, record)
    except Exception as e:  # noqa: BLE001 - the trajectory ends as env_error, the run goes on
        warn_once("reset", f"environment {type(env).__name__}.reset raised: {traceback.format_exc()}")
        return e


def expired(t: Trajectory, lim: EnvLimits) -> bool:
    return lim.trajectory_timeout_s is not None and time.monotonic() - t.started >= lim.trajectory_timeout_s


async def step(t: Trajectory, text: str, lim: EnvLimits) -> Any:
    """The environment's answer; "timeout" past the trajectory's wall clock; "env_error"."""
    left = None if lim.trajectory_timeout_s is None else max(0.0, lim.trajectory_timeout_s - (time.monotonic() - t.started))
    try:
        return await asyncio.wait_for(acall(t.env.step, text), left)
    except asyncio.TimeoutError:
        return StopReason.TIMEOUT
    except Exception as e:  # noqa: BLE001 - the trajectory ends as env_error, the run goes on
        warn_once("step", f"environment {type(t.env).__name__}.step raised: {traceback.format_exc()}")
        t.error = error_line(e, f"{type(t.env).__name__}.step")
        return StopReason.ENV_ERROR


def why_stop(t: Trajectory, cut: str | None, answer: Any, lim: EnvLimits) -> str | None:
    if isinstance(answer, str):
        return answer
    if cut is not None:  # a cut turn ends the trajectory as truncated, whatever the environment made of it
        return cut
    if answer.done:
        return StopReason.DONE
    if t.turns >= lim.max_turns:
        return StopReason.MAX_TURNS
    return None


async def finish(t: Trajectory, timeout: float | None) -> None:
    """The environment's ``finish(stop_reason)`` hook, once: a number returned is its reward."""
    fin = getattr(t.env, "finish", None)
    if fin is None:
        return
    try:
        r = await asyncio.wait_for(acall(fin, t.stop_reason), timeout)
    except Exception:  # noqa: BLE001
        warn_once("finish", f"environment {type(t.env).__name__}.finish raised: {traceback.format_exc()}")
        return
    if r is not None:
        t.reward = float(r)


def to_rollout(tok: Any, t: Trajectory, version: int, check: bool) -> Rollout:
    """The Rollout of a finished trajectory; its ``adapter_version`` is the oldest version its
    turns ran with (``version``, the engine's, if it sampled none)."""
    if check:
        t.sanity_diff = sanity(tok, t)
    extra = {"env_sanity_diff": t.sanity_diff} if t.sanity_diff is not None else {}
    out = make_rollout(tok, t.record, t.prompt_ids, t.ids, t.logprobs, t.mask, t.stop_reason, t.turns, t.reward,
                       t.counters, t.transcript, version, list(t.versions), extra)
    out.error, out.token_versions = t.error, t.token_versions
    return out


def make_rollout(tok: Any, rec: Any, prompt_ids: list[int], ids: list[int], logprobs: list[float], mask: list[int],
                 stop: str | None, turns: int, reward: float | None, counters: dict[str, Any], messages: Any,
                 version: int, weight_versions: list[int], extra: dict[str, Any] | None = None) -> Rollout:
    """The Rollout of one trajectory, an environment's (:func:`to_rollout`) or a rollout function's
    (``user_fn.to_rollout``): the record's columns plus the trajectory's own (stop reason,
    truncated, turns, env_reward, every tool counter, ``extra``); its ``adapter_version`` is the
    oldest of ``weight_versions`` (``version``, the engine's, if it sampled none)."""
    name = None if stop is None else str(stop)
    cols = dict(rec.columns)
    cols.update(stop_reason=name, truncated=stop != StopReason.DONE, turns=turns, env_reward=reward,
                **{k: int(counters.get(k) or 0) for k in TOOL_COUNTERS}, **(extra or {}))
    return Rollout(prompt_id=rec.id, prompt=rec.prompt, prompt_ids=prompt_ids, completion_ids=ids,
                   completion=tok.decode(ids, skip_special_tokens=True), logprobs=logprobs,
                   finish_reason=finish_reason(stop), adapter_version=min(weight_versions, default=version),
                   columns=cols, loss_mask=mask, turns=turns, stop_reason=name, messages=messages,
                   weight_versions=list(weight_versions))


def finish_reason(stop: str | None) -> str:
    """A trajectory's ``finish_reason``: "stop" when done, "abort" when the engine aborted it,
    else "length" (cut by a limit, or ended otherwise: truncated)."""
    return "stop" if stop == StopReason.DONE else "abort" if stop == StopReason.ABORT else "length"


def sanity(tok: Any, t: Trajectory) -> int:
    """First index where prompt + built ids differ from a full re-render (-1: none): the whole
    conversation through the chat template where the environment opened it, else the decoded text
    tokenized again."""
    built = t.prompt_ids + t.ids
    if t.messages is not None:
        msgs = list(t.messages)
        sampled_last = bool(t.mask) and t.mask[-1] == 1
        if sampled_last:  # the last turn, not followed by environment messages yet
            last = len(t.mask) - t.mask[::-1].index(0) if 0 in t.mask else 0
            msgs.append({"role": "assistant", "content": said(tok, t.ids[last:])})
        # ended on the environment's messages (or the opening): the built ids end on the next assistant header
        text = render(tok, msgs, generation_prompt=not sampled_last, tools=t.tools)
        ref = tok(text, add_special_tokens=False)["input_ids"]
    else:
        ref = tok(tok.decode(built, skip_special_tokens=False), add_special_tokens=False)["input_ids"]
    at = first_difference(built, ref)
    if at >= 0:
        warn_once("sanity", f"rollout.env_sanity: built ids differ from a full re-render at token {at} of "
                   f"{len(built)}: built {tok.decode(built[at:at + 5])!r} vs re-rendered {tok.decode(ref[at:at + 5])!r} "
                   f"(the re-render would train on other tokens than the ones sampled)")
    return at


def said(tok: Any, ids: list[int]) -> str:
    eos = getattr(tok, "eos_token_id", None)
    return tok.decode(ids[:-1] if ids and ids[-1] == eos else ids)


def error_line(e: BaseException, where: str) -> str:
    """``where: Type: message`` of an environment's or agent's exception, its first line, at most 300 characters."""
    return f"{where}: {type(e).__name__}: {(str(e).splitlines() or [''])[0]}"[:300]


def warn_once(key: str, msg: str) -> None:
    if key not in _WARNED:
        _WARNED.add(key)
        log.warning(msg)
