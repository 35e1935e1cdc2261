"""The environment protocol, and how a config names one.

One instance per trajectory (an environment may keep state between turns):

* ``reset(record) -> messages | None``: the dataset row in (a ``PromptRecord``); the opening
  messages out, or None to start from the record's prompt as it is (the single-turn case);
* ``step(completion) -> EnvStep``: the assistant's text of this turn in; the messages the
  environment answers with (``[{"role": "user" | "tool", "content": ...}]``, appended to the
  trajectory as tokens with loss mask 0), a reward or None, ``done``, and free-form ``info``.

Both may be plain or ``async`` functions. ``rollout.env`` names the class: a registered name
(``single_turn``) or ``module.path:Class`` / ``path/to/file.py:Class``; ``rollout.env_kwargs``
are passed to its constructor.
"""

from __future__ import annotations

import asyncio
import inspect
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol, runtime_checkable

from grpo_dist.util.plugins import load_object

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


_ENVS: dict[str, Callable[..., Env]] = {}


def register_env(name: str):
    """Class decorator: ``rollout.env: <name>`` makes instances of it."""

    def deco(cls):
        _ENVS[name] = cls
        return cls

    return deco


def env_factory(spec: str, kwargs: dict[str, Any] | None = None) -> Callable[[], Env]:
    """A function making a fresh environment per trajectory; ValueError naming ``spec`` if it
    cannot (unknown name, missing module, not a class with reset and step)."""
    cls = _ENVS.get(spec)
    if cls is None:
        if ":" not in spec:
            raise ValueError(f"unknown environment {spec!r}: not a registered name (known: {', '.join(sorted(_ENVS))}); "
                             f"a plug-in is given as 'module.path:Class' or 'path/to/file.py:Class'")
        cls, where = load_object(spec, "environment", "Class")
        if not (callable(getattr(cls, "reset", None)) and callable(getattr(cls, "step", None))):
            raise ValueError(f"environment {spec!r}: {where} has no reset and step methods")
    kw = dict(kwargs or {})
    return lambda: cls(**kw)


def make_env(spec: str, kwargs: dict[str, Any] | None = None) -> Env:
    return env_factory(spec, kwargs)()


def call(fn: Callable, *args: Any) -> Any:
    """Call a plain or async environment method from synchronous code (the rollout worker)."""
    out = fn(*args)
    if inspect.isawaitable(out):
        return asyncio.run(_await(out))
    return out


async def _await(x):
    return await x
