"""Tool environments: plain functions as tools, and TRL-style environment classes.

What a TRL user has works unchanged:

* a tool is a plain (or async) function with type hints and a Google-style docstring; its JSON
  schema comes from ``transformers.utils.get_json_schema``, as TRL and the chat templates take it;
* a TRL-style environment class (``reset(**row_columns)``, public methods as tools, optional
  ``get_reward()``) is wrapped in :class:`TRLEnv`.

:class:`ToolEnv` is the environment: ``reset`` opens with the question (a system prompt
first if given); each ``step`` parses the assistant's tool calls (``rollout.tool_parser``),
runs at most ``rollout.max_parallel_calls`` of them concurrently, each with
``rollout.tool_timeout_s``, and answers with one ``tool`` message per call, in the order the calls
were written. A malformed call,
an unknown tool, bad arguments, an exception or a timeout becomes an ``Error: ...`` tool
message and is counted (``info``: tool_calls, tool_errors, tool_timeouts, tool_malformed); the
run goes on. A turn without a tool call is the final answer: done, scored by
:meth:`ToolEnv.score` (the last number against the ``answer`` column).
"""

from __future__ import annotations

import asyncio
import inspect
import json
import re
from dataclasses import dataclass
from typing import Any, Callable

from grpo_dist.envs.base import EnvLimits, EnvStep, acall, register_env
from grpo_dist.envs.parsers import ToolCall, get_parser
from grpo_dist.util.plugins import load_object

_NUM = re.compile(r"-?\d+(?:\.\d+)?")


@dataclass
class ToolResult:
    name: str
    content: str
    error: bool = False
    timed_out: bool = False


class Tool:
    """A function the model may call: its schema, and a guarded call."""

    def __init__(self, fn: Callable[..., Any]):
        from transformers.utils import get_json_schema

        self.fn = fn
        try:
            self.schema = get_json_schema(fn)
        except Exception as e:  # noqa: BLE001 - transformers' own exception types differ by version
            raise ValueError(f"tool {getattr(fn, '__name__', fn)!r}: no JSON schema from its type hints and "
                             f"Google-style docstring ({type(e).__name__}: {e})") from None
        self.name = self.schema["function"]["name"]
        self._sig = inspect.signature(fn)

    async def __call__(self, arguments: dict[str, Any], timeout: float | None) -> ToolResult:
        try:
            self._sig.bind(**arguments)
        except TypeError as e:
            return ToolResult(self.name, f"Error: bad arguments for {self.name}: {e}", error=True)
        try:
            out = await asyncio.wait_for(acall(self.fn, **arguments), timeout)
        except asyncio.TimeoutError:
            return ToolResult(self.name, f"Error: {self.name} timed out after {timeout} s", error=True, timed_out=True)
        except Exception as e:  # noqa: BLE001 - the model reads it; the run goes on
            return ToolResult(self.name, f"Error: {self.name} raised {type(e).__name__}: {e}", error=True)
        return ToolResult(self.name, _text(out))


def _text(out: Any) -> str:
    if isinstance(out, str):
        return out
    try:
        return json.dumps(out, ensure_ascii=False)
    except (TypeError, ValueError):
        return str(out)


def as_tool(x: Any) -> Tool:
    """A :class:`Tool` from a function, a bound method or a ``'module:function'`` spec."""
    if isinstance(x, Tool):
        return x
    if isinstance(x, str):
        x, _ = load_object(x, "tool", "function")
    return Tool(x)


@register_env("tools")
class ToolEnv:
    """An environment whose actions are tool calls (``rollout.env: tools`` with
    ``env_kwargs: {tools: ['module:function', ...]}``, or subclassed)."""

    def __init__(self, tools: list[Any] = (), *, system_prompt: str | None = None, question_column: str = "question",
                 answer_column: str = "answer", stop_after_call: bool | None = None, parser: str | None = None,
                 examples: list[dict[str, Any]] | None = None, question_suffix: str = "", state_tools: bool = True,
                 limits: EnvLimits | None = None):
        """``examples``: demonstration messages (a worked conversation: user, assistant call, tool
        result, assistant answer) between the system prompt and the question; prompt tokens, never
        trained on. ``question_suffix`` is appended to each question. ``state_tools=False``: the
        system prompt describes the tools itself, so neither the template's ``tools=`` nor the
        parser's generic statement of the schemas is added (a small model follows a short
        instruction and one example better than a block of JSON schemas)."""
        self.limits = limits or EnvLimits()
        self.tool_list = [as_tool(t) for t in tools]
        self.by_name = {t.name: t for t in self.tool_list}
        # for the chat template's tools= (or the parser's statement in the system prompt)
        self.tools = [t.schema for t in self.tool_list] if state_tools else []
        self.examples = [dict(m) for m in examples or []]
        self.question_suffix = question_suffix
        self.parser = get_parser(parser or self.limits.tool_parser)
        after = self.limits.max_parallel_calls == 1 if stop_after_call is None else stop_after_call
        self.stop = list(self.parser.stop) if after and self.tool_list else []
        self.system_prompt, self.question_column, self.answer_column = system_prompt, question_column, answer_column
        self.record: Any = None

    def question(self, record: Any) -> str:
        return str((record.columns or {}).get(self.question_column) or record.prompt) + self.question_suffix

    def reset(self, record: Any) -> list[dict[str, Any]]:
        self.record = record
        system = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        return system + [dict(m) for m in self.examples] + [{"role": "user", "content": self.question(record)}]

    async def step(self, completion: str) -> EnvStep:
        parsed = self.parser.parse(completion)
        if parsed.attempted == 0:  # no call: the final answer
            return EnvStep(done=True, reward=await acall(self.score, completion))
        limit = self.limits.max_parallel_calls
        items = parsed.in_order()
        run_these = [c for c in items if isinstance(c, ToolCall)][:limit]
        ran = iter(await asyncio.gather(*(self.run_call(c) for c in run_these)))
        chosen = {id(c) for c in run_these}
        # one result per call, in the order written (the model matches them by position)
        results = [ToolResult("error", f"Error: {c}", error=True) if not isinstance(c, ToolCall) else
                   next(ran) if id(c) in chosen else
                   ToolResult(c.name, f"Error: at most {limit} tool call(s) per turn; {c.name} was not run", error=True)
                   for c in items]
        info = {"tool_calls": parsed.attempted, "tool_errors": sum(r.error for r in results),
                "tool_timeouts": sum(r.timed_out for r in results), "tool_malformed": len(parsed.errors)}
        return EnvStep(messages=[{"role": "tool", "name": r.name, "content": r.content} for r in results], info=info)

    async def run_call(self, call: ToolCall) -> ToolResult:
        tool = self.by_name.get(call.name)
        if tool is None:
            return ToolResult(call.name, f"Error: unknown tool {call.name!r}; the tools are: "
                                         f"{', '.join(self.by_name) or 'none'}", error=True)
        return await tool(call.arguments, self.limits.tool_timeout_s)

    def score(self, final: str) -> float | None:
        """1.0 if the last number of the final answer equals the ``answer`` column, else 0.0;
        None without an answer column (the reward functions decide)."""
        want = (self.record.columns or {}).get(self.answer_column) if self.record is not None else None
        if want is None:
            return None
        return 1.0 if numbers_equal(final, want) else 0.0


def numbers_equal(text: str, answer: Any) -> bool:
    found = _NUM.findall(text or "")
    try:
        return bool(found) and abs(float(found[-1]) - float(answer)) <= 1e-6
    except (TypeError, ValueError):
        return False


class TRLEnv(ToolEnv):
    """A TRL-style environment instance: ``reset(**row)`` (the row's ``prompt`` and columns; a
    string returned is added to the user message), public methods (not ``reset``/``get_reward``)
    as tools, ``get_reward()`` (optional, plain or async) as the environment's reward at the end."""

    RESERVED = ("reset", "get_reward")

    def __init__(self, inner: Any, *, tools: list[Any] = (), limits: EnvLimits | None = None, **kwargs: Any):
        methods = [m for name, m in inspect.getmembers(inner, inspect.ismethod)
                   if name not in self.RESERVED and not name.startswith("_")]
        super().__init__(list(tools) + methods, limits=limits, **kwargs)
        self.inner = inner

    async def reset(self, record: Any) -> list[dict[str, Any]]:
        self.record = record
        observation = await acall(self.inner.reset, **{"prompt": record.prompt, **(record.columns or {})})
        parts = [self.question(record)] + ([str(observation)] if observation is not None else [])
        return [{"role": "user", "content": "\n\n".join(p for p in parts if p)}]

    def score(self, final: str) -> float | None:
        return None  # the environment owns its reward (get_reward) or the reward functions do

    async def finish(self, stop_reason: str | None) -> float | None:
        get = getattr(self.inner, "get_reward", None)
        return None if get is None else float(await acall(get))
