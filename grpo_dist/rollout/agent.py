"""Agents written against the OpenAI API, trained unchanged (``rollout.agent``).

``rollout.agent: module.path:fn`` (or ``path/to/file.py:fn``) is called once per trajectory
(``rollout.group_size`` times per dataset row) as ``fn(base_url, row, **rollout.agent_kwargs)``,
plain or ``async def``. ``row`` is the dataset row as a dict (``{"prompt": ..., **columns}``);
``base_url`` is an OpenAI-compatible endpoint of this rollout worker for this trajectory only
(grpo_dist/rollout/agent_server.py: ``/chat/completions`` with ``tools`` / ``tool_calls``,
``/completions``, ``/models``), e.g. ``openai.OpenAI(base_url=base_url, api_key="-")``. It
returns a number (the trajectory's ``env_reward`` column) or None; the reward functions score
the final conversation either way.

Every request is recorded token in, token out (grpo_dist/rollout/agent_segments.py): the trained
sample is the model's sampled ids with their behaviour log-probs (mask 1) and the template's
tokens of the messages the agent added (mask 0). A request that does not extend the conversation
so far starts a new segment: the Rollout is the last segment (the conversation the rewards
score) and carries the earlier ones in ``Rollout.segments``, trained as samples of their own
with the trajectory's advantage (``rollout/agent_segments``: segments beyond the first).

The requests of all live trajectories of a worker call are batched into engine calls, as a
``rollout.rollout_fn``'s are (one engine call once every running agent waits on one). An agent
past ``rollout.trajectory_timeout_s`` is cut (stop_reason ``timeout``; its endpoint answers 410
from then on); one that raises ends its trajectory as ``env_error`` with a warning, and the
run goes on (past ``rollout.max_env_error_rate`` it stops). An engine call that raised is not an
agent's error: the agents waiting on it get a 500, and the worker's call fails with the
engine's error (the driver replaces a dead engine, or stops with one line). Stop reasons otherwise: ``done``, or the limit that cut the last call (``length``,
``budget``, ``context``, ``max_turns``).
"""

from __future__ import annotations

import asyncio
import logging
import traceback
from pathlib import Path
from typing import Any, Callable

from grpo_dist.envs.base import acall, run
from grpo_dist.rollout.agent_segments import AgentTrajectory, Segment
from grpo_dist.rollout.agent_server import AgentServer, AgentSession
from grpo_dist.rollout.base import Generator, SamplingSpec
from grpo_dist.rollout.trajectory import encoder_for, error_line, make_rollout, warn_once
from grpo_dist.rollout.user_fn import Generation, _Batcher
from grpo_dist.types import Rollout, RolloutGroup, StopReason
from grpo_dist.util.plugins import load_function

log = logging.getLogger("grpo_dist.rollout")


def load_agent(spec: str) -> Callable[..., Any]:
    """The agent function ``spec`` names; ValueError naming it."""
    return load_function(spec, "agent")


class AgentRollouts:
    """``rollout.agent`` of a rollout worker: one endpoint, trajectories of a batch of records."""

    def __init__(self, r: Any, model_name: str = "policy"):
        self.r, self.spec, self.kwargs = r, r.agent, dict(r.agent_kwargs or {})
        self.fn = load_agent(self.spec)
        self.server = AgentServer(model_name)

    @classmethod
    def from_config(cls, r: Any, model_path: str = "policy") -> "AgentRollouts | None":
        return cls(r, Path(str(model_path)).name or "policy") if getattr(r, "agent", None) else None

    def generate(self, engine: Generator, records: list[Any], prompt_ids: list[list[int]], spec: SamplingSpec,
                 seeds: list[list[int]] | None, max_model_len: int, version: int) -> list[RolloutGroup]:
        """``spec.n`` trajectories per record (seeds[i][j]: trajectory j of record i)."""
        encoder_for(engine.tokenizer)  # a chat template that cannot give exact tokens stops here (TemplateError)
        return run(self._all(engine, records, prompt_ids, spec, seeds, max_model_len, version))

    def close(self) -> None:
        run(self.server.stop())

    async def _all(self, engine, records, prompt_ids, spec, seeds, max_model_len, version) -> list[RolloutGroup]:
        await self.server.start()
        batcher = _Batcher(engine, len(records) * spec.n)
        tok = engine.tokenizer
        # an engine call that raised fails the whole call with its error (the agents got a 500 and end)
        flat = await batcher.gather([self._one(tok, batcher.submit, batcher.finished, records[i], prompt_ids[i], spec,
                                               seeds[i][j] if seeds is not None else None, max_model_len, version)
                                     for i in range(len(records)) for j in range(spec.n)], grace=5.0)
        return [RolloutGroup(prompt_id=rec.id, rollouts=list(flat[i * spec.n:(i + 1) * spec.n]))
                for i, rec in enumerate(records)]

    async def stream_group(self, call: Callable[..., Any], tok: Any, record: Any, prompt_ids: list[int],
                           spec: SamplingSpec, seeds: list[int] | None, max_model_len: int,
                           version: int) -> RolloutGroup:
        """One record's ``spec.n`` trajectories in the streaming pipeline (on :func:`env_loop`):
        each request is its own engine request, ``await call(prompt_ids, spec, seed) -> (Sample,
        version)`` (the async engine batches whatever is in flight), and every call keeps the
        version that sampled it (``Rollout.weight_versions``; weights may change between calls).
        An engine request that raised fails the group with its error (its agents got a 500)."""
        await self.server.start()
        failed: list[BaseException] = []

        async def submit(ids: list[int], one: SamplingSpec, seed: int | None) -> Generation:
            if failed:
                raise failed[0]
            try:
                s, v = await call(ids, one, seed)
            except Exception as e:  # noqa: BLE001 - the engine's: the group fails with it below
                failed.append(e)
                raise
            return Generation(list(s.token_ids), list(s.logprobs), s.text, s.finish_reason, v)

        rollouts = await asyncio.gather(*[self._one(tok, submit, lambda: None, record, prompt_ids, spec,
                                                    None if seeds is None else seeds[j], max_model_len, version)
                                          for j in range(spec.n)])
        if failed:
            raise failed[0]
        return RolloutGroup(prompt_id=record.id, rollouts=list(rollouts))

    async def _one(self, tok: Any, submit: Callable[..., Any], finished: Callable[[], None], rec: Any,
                   prompt_ids: list[int], spec: SamplingSpec, seed: int | None, max_model_len: int,
                   version: int) -> Rollout:
        """One trajectory: the agent called with its base URL, its requests sampled through ``submit``."""
        r = self.r
        traj = AgentTrajectory(tok, encoder_for(tok), r.max_tool_result_tokens)
        session = AgentSession(traj, submit, spec, seed, max_model_len, r.sampled_budget, r.max_turns, r.tool_parser,
                               self.server.model, r.agent_tools_prompt)
        key, url = self.server.open(session)
        reward, stop, raised, error = None, None, None, None
        try:
            out = await asyncio.wait_for(acall(self.fn, url, dict(rec.as_example()), **self.kwargs),
                                         r.trajectory_timeout_s)
            if out is not None and (isinstance(out, bool) or not isinstance(out, (int, float))):
                warn_once("agent_return", f"rollout.agent {self.spec!r} returned {type(out).__name__} "
                          f"{out!r:.80}: a reward is a number or None (taken as None)")
            else:
                reward = None if out is None else float(out)
        except asyncio.TimeoutError:
            stop = StopReason.TIMEOUT
        except Exception as e:  # noqa: BLE001 - the trajectory ends as env_error, the run goes on
            stop, raised, error = StopReason.ENV_ERROR, traceback.format_exc(), agent_error(e, session)
        finally:
            self.server.close(key)
            finished()
        if raised is not None:  # once closed: a base_url in the traceback no longer opens anything
            warn_once("agent_error", f"rollout.agent {self.spec!r} raised on record {rec.id}: {raised}")
        stop = stop or session.cut or StopReason.DONE
        out = to_rollout(tok, rec, prompt_ids, traj, session.calls, stop, reward, version, session.versions)
        out.error = error
        return out


def agent_error(e: BaseException, session: AgentSession) -> str:
    """The line naming an agent's exception; with the endpoint's reason for the first request it
    refused, where the line lacks it: a framework's wrapper often puts the SDK's error (which has
    it) after a first line of its own (smolagents: "Error while generating output:")."""
    line, why = error_line(e, "agent"), session.refused
    if why is None or str(why) in line:
        return line
    return f"{line} [the endpoint refused its request ({why.status} {why.code or 'invalid_request_error'}): {why}]"


def _sample(tok: Any, rec: Any, seg: Segment | None, prompt_ids: list[int], stop: str, version: int, turns: int,
            versions: list[int], reward: float | None = None, counters: dict[str, Any] | None = None,
            extra: dict[str, Any] | None = None) -> Rollout:
    return make_rollout(tok, rec, list(seg.prompt_ids) if seg else list(prompt_ids), list(seg.ids) if seg else [],
                        list(seg.logprobs) if seg else [], list(seg.mask) if seg else [], stop, turns, reward,
                        counters or {}, list(seg.transcript) if seg else [], version, versions, extra)


def to_rollout(tok: Any, rec: Any, prompt_ids: list[int], traj: AgentTrajectory, calls: int, stop: str,
               reward: float | None, version: int, versions: list[int | None] | None = None) -> Rollout:
    """The trajectory's Rollout: its last segment, the earlier ones in ``segments``. ``versions``:
    the weight version of each call, in order (None: ``version``, the batch pipeline's); segments
    hold consecutive calls, so each gets its own calls' versions."""
    segs = traj.segments
    every = [version if v is None else int(v) for v in (versions or [])]
    every += [version] * (calls - len(every))
    parts, at = [], 0
    for s in segs:
        parts.append(every[at:at + s.turns] or [version])
        at += s.turns
    out = _sample(tok, rec, segs[-1] if segs else None, prompt_ids, stop, version, calls,
                  every[:calls] if segs else [], reward, traj.counters, {"agent_segments": len(segs)})
    if len(segs) > 1:  # earlier segments: the prompt and ids of each, trained as samples of their own
        out.segments = [_sample(tok, rec, s, prompt_ids, StopReason.DONE, version, s.turns, p)
                        for s, p in zip(segs[:-1], parts[:-1])]
    return out
