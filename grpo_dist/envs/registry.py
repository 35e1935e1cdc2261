"""How a config names environments: the registry, factories, and the environment of each record.

``rollout.env`` names the class: a registered name (``single_turn``, ``calculator``, ...) or
``module.path:Class`` / ``path/to/file.py:Class``; ``rollout.env_kwargs`` go to its constructor
(and ``limits``, an :class:`~grpo_dist.envs.base.EnvLimits`, where the constructor takes it). A
class with ``reset`` but no ``step`` is a TRL-style environment (``reset(**row_columns)``, public
methods as tools, optional ``get_reward()``) and is wrapped in :class:`grpo_dist.envs.tools.TRLEnv`.
"""

from __future__ import annotations

import inspect
from typing import Any, Callable

import grpo_dist.envs.builtin  # noqa: F401  (registers calculator, guess_number, python_code, tools)
import grpo_dist.envs.single_turn  # noqa: F401  (registers single_turn)
from grpo_dist.envs.base import _ENVS, Env, EnvLimits, call
from grpo_dist.envs.chat import TemplateError, check_template
from grpo_dist.envs.tools import TRLEnv
from grpo_dist.util.plugins import load_object


def env_factory(spec: str, kwargs: dict[str, Any] | None = None,
                limits: EnvLimits | None = None) -> Callable[[], Env]:
    """A function making a fresh environment per trajectory; ValueError naming ``spec`` if it
    cannot (unknown name, missing module, no reset method)."""
    cls = _ENVS.get(spec)
    if cls is None:
        if ":" not in spec:
            raise ValueError(f"unknown environment {spec!r}: not a registered name (known: {', '.join(sorted(_ENVS))}); "
                             f"a plug-in is given as 'module.path:Class' or 'path/to/file.py:Class'")
        cls, where = load_object(spec, "environment", "Class")
        if not callable(getattr(cls, "reset", None)):
            raise ValueError(f"environment {spec!r}: {where} has no reset method")
    kw = dict(kwargs or {})
    lim = limits or EnvLimits()
    if not callable(getattr(cls, "step", None)):  # TRL-style: reset(**row), public methods as tools
        return lambda: TRLEnv(cls(**kw), limits=lim)
    if _takes(cls, "limits"):
        kw.setdefault("limits", lim)
    return lambda: cls(**kw)


def _takes(cls: Any, name: str) -> bool:
    try:
        params = inspect.signature(cls).parameters
    except (TypeError, ValueError):
        return False
    return name in params or any(p.kind is p.VAR_KEYWORD for p in params.values())


def make_env(spec: str, kwargs: dict[str, Any] | None = None, limits: EnvLimits | None = None) -> Env:
    return env_factory(spec, kwargs, limits)()


class EnvSource:
    """The environment of each record: ``rollout.env``, or, with ``rollout.env_column`` set, the
    record's value in that column: a name of ``rollout.envs`` (``{name: {env, kwargs}}``) or an
    environment spec; records without a value get ``rollout.env``."""

    def __init__(self, env: str, kwargs: dict[str, Any] | None = None, column: str | None = None,
                 named: dict[str, dict[str, Any]] | None = None, limits: EnvLimits | None = None):
        self.limits = limits or EnvLimits()
        self.column = column
        self.named = dict(named or {})
        self.default = env
        self._factories = {env: env_factory(env, kwargs, self.limits)}

    @classmethod
    def from_config(cls, r: Any) -> "EnvSource | None":
        """None where every trajectory is one completion (single_turn, no column)."""
        if r.env == "single_turn" and not r.env_column:
            return None
        return cls(r.env, r.env_kwargs, r.env_column, r.envs, EnvLimits.from_config(r))

    def name_of(self, record: Any) -> str:
        if self.column is None:
            return self.default
        value = (getattr(record, "columns", None) or {}).get(self.column)
        return self.default if value in (None, "") else str(value)

    def factory(self, name: str) -> Callable[[], Env]:
        if name not in self._factories:
            entry = self.named.get(name)
            spec, kw = (entry.get("env", name), entry.get("kwargs", {})) if entry is not None else (name, {})
            try:
                self._factories[name] = env_factory(spec, kw, self.limits)
            except ValueError as e:
                where = f"column {self.column!r} value {name!r}" if self.column else "rollout.env"
                raise ValueError(f"{where}: {e}") from None
        return self._factories[name]

    def make(self, record: Any) -> Env:
        return self.factory(self.name_of(record))()


def check_envs(r: Any, tokenizer: Any, records: list[Any]) -> dict[str, tuple[Any, Any]]:
    """Start-up checks of a multi-turn config (``r`` = ``cfg.rollout``): every environment that
    the config and the records' ``env_column`` name resolves, one instance of each is made (its
    keyword arguments, its tools and their schemas) and reset on the first record that names it,
    and the model's chat template is prefix-preserving (:func:`grpo_dist.envs.chat.check_template`).
    ValueError naming the problem. Returns ``{name: (record, env, opening)}``: each environment
    made, the record it was reset on (None: no records) and what its reset returned."""
    source = EnvSource.from_config(r)
    if source is None:
        return {}
    first: dict[str, Any] = {}
    for rec in records:
        first.setdefault(source.name_of(rec), rec)
    if not first:
        first[source.default] = None
    out = {}
    for name in sorted(first):
        out[name] = (first[name], *_try_env(source, name, first[name], r))
    try:
        check_template(tokenizer)
    except TemplateError as e:
        raise ValueError(f"model.path's tokenizer: {e}") from None
    return out


def _try_env(source: EnvSource, name: str, record: Any, r: Any) -> tuple[Env, Any]:
    """Make environment ``name`` and reset it on ``record`` (None: not reset); it and its opening."""
    factory = source.factory(name)
    entry = source.named.get(name)
    kwargs = entry.get("kwargs") if entry is not None else r.env_kwargs if name == source.default else None
    what = f"environment {name!r}" + (f" with rollout.env_kwargs {kwargs!r}" if kwargs and entry is None else
                                      f" (rollout.envs) with kwargs {kwargs!r}" if kwargs else "")
    try:
        env = factory()
    except Exception as e:  # noqa: BLE001 - whatever the constructor raises is the user's config
        raise ValueError(f"{what} cannot be made: {type(e).__name__}: {_line(e)}") from None
    if record is None:
        return env, None
    try:
        return env, call(env.reset, record)
    except Exception as e:  # noqa: BLE001
        raise ValueError(f"{what}: reset raised on record {getattr(record, 'id', '?')}: {type(e).__name__}: "
                         f"{_line(e)}") from None


def _line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else ""
