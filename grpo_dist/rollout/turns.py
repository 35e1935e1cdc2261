"""Multi-turn trajectories in the batch rollout worker (``rollout.env`` other than single_turn).

Token in, token out: a trajectory is its prompt ids, then per turn the ids the engine sampled
(kept as they came, with their behaviour log-probs, loss mask 1, the end-of-turn token
included), then the environment's answer appended as the tokens the chat template adds for
those messages (loss mask 0, log-prob 0.0). The history is never decoded and re-encoded.

Turns run in lock step: each round generates one turn for every trajectory still going, in one
engine call, then asks each trajectory's environment (one instance per trajectory) for its
answer. A trajectory stops when its environment says ``done``, when a turn is cut by
``rollout.max_tokens`` ("length"), after ``rollout.max_turns`` turns ("max_turns"), or when the
next turn would not fit in ``model.max_model_len`` ("context").
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from grpo_dist.envs.base import Env, call
from grpo_dist.rollout.base import Generator, SamplingSpec
from grpo_dist.types import Rollout, RolloutGroup

_MASK63 = (1 << 63) - 1
_BASE = [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}]


@dataclass
class Trajectory:
    record: Any
    prompt_ids: list[int]
    seed: int | None
    env: Env
    ids: list[int] = field(default_factory=list)  # everything after the prompt
    logprobs: list[float] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    turns: int = 0
    finish_reason: str = "stop"
    stop_reason: str | None = None

    def add(self, ids: list[int], logprobs: list[float] | None) -> None:
        self.ids += ids
        self.logprobs += logprobs if logprobs is not None else [0.0] * len(ids)
        self.mask += [1 if logprobs is not None else 0] * len(ids)


class MessageEncoder:
    """The token ids an environment's messages add after an assistant turn: the chat template's
    rendering of (a fixed base conversation + the messages + the next assistant header) past the
    base, without the base's end-of-turn text (the model sampled it). Without a chat template:
    the messages' contents as plain text."""

    def __init__(self, tokenizer):
        self.tok = tokenizer
        self.template = getattr(tokenizer, "chat_template", None)
        if self.template:
            base = tokenizer.apply_chat_template(_BASE, tokenize=False)
            self._cut = base.rindex(_BASE[-1]["content"]) + len(_BASE[-1]["content"])
            self._eos = tokenizer.eos_token or ""

    def __call__(self, messages: list[dict[str, Any]]) -> list[int]:
        if not messages:
            return []
        if not self.template:
            text = "".join(str(m.get("content", "")) for m in messages)
        else:
            full = self.tok.apply_chat_template(_BASE + list(messages), tokenize=False, add_generation_prompt=True)
            text = full[self._cut:]
            if self._eos and text.startswith(self._eos):
                text = text[len(self._eos):]  # the model sampled the end of its turn
        return self.tok(text, add_special_tokens=False)["input_ids"]


def turn_seed(seed: int | None, turn: int) -> int | None:
    """Turn 0 samples with the sample's own seed (a one-turn trajectory is today's completion);
    later turns with seeds derived from it."""
    if seed is None or turn == 0:
        return seed
    return (seed * 6364136223846793005 + turn * 1442695040888963407) & _MASK63


def run_trajectories(engine: Generator, records: list[Any], prompt_ids: list[list[int]], spec: SamplingSpec,
                     seeds: list[list[int]] | None, make_env: Callable[[], Env], max_turns: int,
                     max_model_len: int, version: int) -> list[RolloutGroup]:
    """``spec.n`` trajectories per record (seeds[i][j]: trajectory j of record i)."""
    encode = MessageEncoder(engine.tokenizer)
    groups: list[list[Trajectory]] = []
    for i, (rec, pids) in enumerate(zip(records, prompt_ids)):
        trajs = []
        for j in range(spec.n):
            env = make_env()
            opening = call(env.reset, rec)
            start = list(pids) if opening is None else encode_opening(engine, opening)
            trajs.append(Trajectory(rec, start, seeds[i][j] if seeds is not None else None, env))
        groups.append(trajs)
    active = [t for g in groups for t in g]
    one = SamplingSpec(n=1, temperature=spec.temperature, top_p=spec.top_p, top_k=spec.top_k,
                       max_tokens=spec.max_tokens, stop=list(spec.stop))
    while active:
        outs = engine.generate([t.prompt_ids + t.ids for t in active], one,
                               seeds=None if seeds is None else [[turn_seed(t.seed, t.turns)] for t in active])
        still = []
        for t, (sample,) in zip(active, outs):
            t.add(sample.token_ids, sample.logprobs)
            t.turns += 1
            t.finish_reason = sample.finish_reason
            answer = call(t.env.step, sample.text)
            if answer.done:
                t.stop_reason = "done"
            elif sample.finish_reason == "length":
                t.stop_reason = "length"
            elif t.turns >= max_turns:
                t.stop_reason = "max_turns"
            else:
                extra = encode(answer.messages)
                if len(t.prompt_ids) + len(t.ids) + len(extra) + spec.max_tokens > max_model_len:
                    t.stop_reason = "context"
                else:
                    t.add(extra, None)
                    still.append(t)
        active = still
    tok = engine.tokenizer
    return [RolloutGroup(prompt_id=g[0].record.id, rollouts=[
        Rollout(prompt_id=t.record.id, prompt=t.record.prompt, prompt_ids=t.prompt_ids,
                completion=tok.decode(t.ids, skip_special_tokens=True), completion_ids=t.ids, logprobs=t.logprobs,
                finish_reason=t.finish_reason, adapter_version=version, columns=dict(t.record.columns),
                loss_mask=t.mask, turns=t.turns, stop_reason=t.stop_reason) for t in g]) for g in groups]


def encode_opening(engine: Generator, messages: list[dict[str, Any]]) -> list[int]:
    """The prompt ids of an environment's opening messages (chat template + generation prompt)."""
    tok = engine.tokenizer
    if getattr(tok, "chat_template", None):
        text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return tok(text, add_special_tokens=False)["input_ids"]  # the template holds the BOS if any
    return tok("".join(str(m.get("content", "")) for m in messages))["input_ids"]
