"""The environment protocol, how a config names one, and the loop environments run on.

One instance per trajectory (an environment may keep state between turns):

* ``reset(record) -> messages | None``: the dataset row in (a ``PromptRecord``); the opening
  messages out, or None to start from the record's prompt as it is (the single-turn case);
* ``step(completion) -> EnvStep``: the assistant's text of this turn in; the messages the
  environment answers with (``[{"role": "user" | "tool", "content": ...}]``, appended to the
  trajectory as tokens with loss mask 0), a reward or None, ``done``, and free-form ``info``
  (numeric entries named in :data:`grpo_dist.types.TOOL_COUNTERS` are summed per trajectory into reward columns and
  metrics).

Optional members, read by the rollout: ``stop`` (more stop strings for every turn, e.g. a tool
parser's ``</tool_call>``), ``tools`` (JSON schemas for the chat template's ``tools=``) with
``parser`` (which states them in a system prompt where the template has no ``tools=``), and
``finish(stop_reason) -> reward | None`` (called once when the trajectory ends, whatever ended
it; a number returned is the environment's reward).

Methods may be plain or ``async``. They run on one event loop per process (a daemon thread,
:func:`env_loop`), so an async environment's state (a subprocess, a client) lives across turns;
plain methods run in daemon threads, so a slow one does not hold back the others and a hung one
can be abandoned at its timeout.

``rollout.env`` names the class (grpo_dist/envs/registry.py resolves it).
"""

from __future__ import annotations

import asyncio
import inspect
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol, runtime_checkable


Message = dict[str, Any]


@dataclass
class EnvStep:
    messages: list[Message] = field(default_factory=list)
    reward: float | None = None
    done: bool = False
    info: dict[str, Any] = field(default_factory=dict)


@runtime_checkable
class Env(Protocol):
    def reset(self, record: Any) -> list[Message] | None: ...

    def step(self, completion: str) -> EnvStep: ...


@dataclass
class EnvLimits:
    """The ``rollout.*`` limits of a trajectory (config fields; see ``RolloutConfig``)."""

    max_turns: int = 4
    max_total_tokens: int | None = None  # completion tokens over all turns, environment tokens included
    max_tool_result_tokens: int | None = None  # one tool message's content, cut in the middle
    tool_timeout_s: float | None = 30.0
    trajectory_timeout_s: float | None = None
    max_parallel_calls: int = 1
    tool_parser: str = "hermes"
    sanity: bool = False

    @classmethod
    def from_config(cls, r: Any) -> "EnvLimits":
        return cls(max_turns=r.max_turns, max_total_tokens=r.max_total_tokens,
                   max_tool_result_tokens=r.max_tool_result_tokens, tool_timeout_s=r.tool_timeout_s,
                   trajectory_timeout_s=r.trajectory_timeout_s, max_parallel_calls=r.max_parallel_calls,
                   tool_parser=r.tool_parser, sanity=r.env_sanity)


_ENVS: dict[str, Callable[..., Any]] = {}  # name -> class (grpo_dist.envs.registry resolves names)


def register_env(name: str):
    """Class decorator: ``rollout.env: <name>`` makes instances of it."""

    def deco(cls):
        _ENVS[name] = cls
        return cls

    return deco


# ---------------------------------------------------------------------------------- the loop

_LOOP: asyncio.AbstractEventLoop | None = None
_LOOP_LOCK = threading.Lock()


def env_loop() -> asyncio.AbstractEventLoop:
    """The process's event loop for environments (started on first use, a daemon thread)."""
    global _LOOP
    with _LOOP_LOCK:
        if _LOOP is None or _LOOP.is_closed():
            loop = asyncio.new_event_loop()
            threading.Thread(target=loop.run_forever, name="grpo-envs", daemon=True).start()
            _LOOP = loop
        return _LOOP


def run(coro, timeout: float | None = None) -> Any:
    """Run ``coro`` on :func:`env_loop` from synchronous code; TimeoutError after ``timeout``."""
    fut = asyncio.run_coroutine_threadsafe(coro, env_loop())
    try:
        return fut.result(timeout)
    except TimeoutError:
        fut.cancel()
        raise


async def acall(fn: Callable, *args: Any, **kwargs: Any) -> Any:
    """Await ``fn(*args)``: a coroutine function directly, a plain one in a daemon thread (so it
    neither blocks the loop nor, when hung, the process's exit)."""
    if inspect.iscoroutinefunction(fn):
        return await fn(*args, **kwargs)
    loop = asyncio.get_running_loop()
    fut = loop.create_future()

    def target() -> None:
        try:
            out = fn(*args, **kwargs)
        except BaseException as e:  # noqa: BLE001 - handed to the awaiting side
            loop.call_soon_threadsafe(_settle, fut, None, e)
        else:
            loop.call_soon_threadsafe(_settle, fut, out, None)

    threading.Thread(target=target, name=f"env-{getattr(fn, '__name__', 'call')}", daemon=True).start()
    out = await fut
    if inspect.isawaitable(out):
        out = await out
    return out


def _settle(fut: asyncio.Future, value: Any, exc: BaseException | None) -> None:
    if fut.done():
        return  # cancelled at its timeout: the result is dropped
    if exc is not None:
        fut.set_exception(exc)
    else:
        fut.set_result(value)


def call(fn: Callable, *args: Any) -> Any:
    """Call a plain or async environment method from synchronous code."""
    out = fn(*args)
    if inspect.isawaitable(out):
        return run(_await(out))
    return out


async def _await(x):
    return await x
