"""Reward-function lookup: builtin names, ``module.path:function`` and ``file.py:function``.

Every reward function has TRL's signature ``fn(prompts, completions, **dataset_columns) ->
list[float]`` and is called as TRL calls it, with keyword arguments (:func:`call_reward`). A config entry (:class:`~grpo_dist.config.RewardFnConfig`) names one with ``fn``:

* a registered name (``correctness``, ``math``, ``format``, ``length``, ``pattern``, ``composite``, or
  anything a plug-in registered with :func:`register_reward`);
* ``package.module:function`` — imported with :mod:`importlib` (the module must be importable,
  e.g. on ``PYTHONPATH``); ``function`` may be dotted (``module:Class.method``);
* ``path/to/file.py:function`` — the file is loaded as a module (relative paths are relative to
  the current directory); each file is loaded once per process;
* from Python (``GRPOTrainer(reward_funcs=[fn])``), the callable itself: the config holds it as a
  :class:`~grpo_dist.util.callables.CallableSpec`, which reaches the reward actors by value.

:func:`build_reward_fns` resolves the whole list eagerly and checks the options, so a bad
plug-in or a misspelt option fails before training starts, with a ``ValueError`` naming the spec.

This module imports no reward family: the families import it to register themselves, and the
package (``grpo_dist.reward``, imported before any of its modules) imports every family, so each
builtin name is registered before a lookup.
"""

from __future__ import annotations

import functools
import inspect
import threading
from dataclasses import dataclass
from typing import Any, Callable, Iterable

from grpo_dist.util.callables import CallableSpec, is_label
from grpo_dist.util.plugins import load_object

__all__ = ["NamedReward", "build_reward_fns", "builtin_names", "call_reward", "get_reward_fn", "is_async",
           "register_reward"]

RewardFn = Callable[..., list]

_RESERVED = ("prompts", "completions")


@dataclass(frozen=True)
class _Entry:
    fn: RewardFn
    validate: Callable[..., None] | None
    options: frozenset[str]  # named parameters that are options, not dataset columns


_REGISTRY: dict[str, _Entry] = {}
_LOCK = threading.Lock()


def register_reward(name: str, *, validate: Callable[..., None] | None = None,
                    columns: Iterable[str] = ()):
    """Decorator registering ``fn`` under ``name`` (usable as ``fn: <name>`` in the config).

    ``validate(**options)``, if given, is called by :func:`build_reward_fns` with the config's
    ``kwargs`` and should raise ``ValueError`` for bad option values. Options of a registered
    function must be named parameters of it (``**kwargs`` is reserved for dataset columns), so a
    misspelt option is an error rather than silently ignored. Named parameters not listed in
    ``columns`` are options: a dataset column of the same name is not passed to ``fn`` (a column
    called ``mode`` must not switch a builtin's mode). Re-registering the same function (e.g. a
    module imported twice) is allowed; another function under a taken name is not.
    """
    if not isinstance(name, str) or not name or ":" in name:
        raise ValueError(f"reward name must be a non-empty string without ':', got {name!r}")

    def deco(fn: RewardFn) -> RewardFn:
        if not callable(fn):
            raise ValueError(f"register_reward({name!r}): {fn!r} is not callable")
        options = frozenset(_named_params(fn) or ()) - set(columns)
        with _LOCK:
            old = _REGISTRY.get(name)
            if old is not None and _qualified(old.fn) != _qualified(fn):
                raise ValueError(f"reward name {name!r} is already registered to {_qualified(old.fn)}")
            _REGISTRY[name] = _Entry(fn, validate, options)
        return fn

    return deco


def _named_params(fn: Any) -> set[str] | None:
    """Keyword-passable parameter names except prompts/completions; None without a signature."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):  # some builtins/extension callables have no signature
        return None
    return {n for n, p in params.items()
            if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and n not in _RESERVED}


def _accepts_var_kwargs(fn: Any) -> bool:
    try:
        return any(p.kind is p.VAR_KEYWORD for p in inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return True


def call_reward(fn: RewardFn, prompts: Any, completions: Any, options: dict[str, Any],
                columns: dict[str, Any]) -> Any:
    """Call ``fn`` as TRL does, ``fn(prompts=..., completions=..., **columns)``, with configured
    ``options`` winning over columns of the same name (or named like a registered function's
    option parameter).

    * ``fn`` names a ``completions`` parameter: keyword call (TRL's ``def f(completions,
      **kwargs)`` gets ``prompts`` in its ``kwargs``); otherwise positional,
      ``fn(prompts, completions, **columns)`` (``lambda p, c, **kw: ...``).
    * ``fn`` has no ``**kwargs``: only the columns it names are passed (TRL would raise).
    """
    blocked = set(options) | set(_RESERVED)
    for entry in list(_REGISTRY.values()):
        if entry.fn is fn:
            blocked |= entry.options
            break
    cols = {k: v for k, v in columns.items() if k not in blocked}
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):  # no signature (a C callable): the house's positional form
        return fn(prompts, completions, **cols, **options)
    named = {n for n, p in params.items() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    var_kw = any(p.kind is p.VAR_KEYWORD for p in params.values())
    if not var_kw:
        cols = {k: v for k, v in cols.items() if k in named}
    if "completions" in named:
        head = {"prompts": prompts} if "prompts" in named or var_kw else {}
        return fn(**head, completions=completions, **cols, **options)
    return fn(prompts, completions, **cols, **options)


def is_async(fn: Any) -> bool:
    """``fn`` (a function, a ``functools.partial`` of one, or an object with an async
    ``__call__``) is an ``async def``: calling it gives a coroutine to await."""
    while isinstance(fn, functools.partial):
        fn = fn.func
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(inspect.getattr_static(type(fn), "__call__", None))


def _qualified(fn: Any) -> str:
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"


def registered_options(fn: Any) -> frozenset[str] | None:
    """The option names of ``fn`` if it is a registered reward function (None for a plug-in)."""
    entry = next((e for e in list(_REGISTRY.values()) if e.fn is fn), None)
    return None if entry is None else entry.options


def builtin_names() -> list[str]:
    """Sorted names currently registered (the builtins plus registered plug-ins)."""
    return sorted(_REGISTRY)


def get_reward_fn(spec: str) -> RewardFn:
    """Resolve ``spec`` to a callable; ``ValueError`` naming ``spec`` if that is impossible."""
    if isinstance(spec, CallableSpec):  # a callable from Python (the reward actors unpickle it here)
        return spec.fn
    if is_label(spec):
        raise ValueError(f"{spec} stands for a Python callable given to GRPOTrainer: a config file records only "
                         f"its name; pass the callable again through the Python API, or name it 'module:function'")
    if not isinstance(spec, str) or not spec.strip():
        raise ValueError(f"reward function spec must be a non-empty string, got {spec!r}")
    spec = spec.strip()
    if ":" not in spec:
        entry = _REGISTRY.get(spec)
        if entry is None:
            raise ValueError(
                f"unknown reward function {spec!r}: not a registered name (known: "
                f"{', '.join(sorted(_REGISTRY))}); a plug-in is given as 'module.path:function' "
                f"or 'path/to/file.py:function'")
        return entry.fn
    obj, where = load_object(spec, "reward function", "function")
    if not callable(obj):
        raise ValueError(f"reward function {spec!r}: {spec.rpartition(':')[2]!r} in {where} is not callable "
                         f"(it is a {type(obj).__name__})")
    return obj


def default_name(spec: str) -> str:
    """The name used when a config entry has none: the spec's last component (a callable's ``__name__``)."""
    if isinstance(spec, CallableSpec):
        return spec.name
    return spec.strip().rpartition(":")[2].rpartition(".")[2]


@dataclass(frozen=True)
class NamedReward:
    """A resolved reward function: ``fn`` has the config ``kwargs`` bound (a ``functools.partial``)."""

    name: str
    fn: Callable[..., Any]
    weight: float = 1.0

    @property
    def is_async(self) -> bool:
        """An ``async def`` reward: the call returns a coroutine (the worker awaits it)."""
        return is_async(self.fn)

    def __call__(self, prompts: list, completions: list, **columns: Any) -> Any:
        """Call ``fn``; dataset columns never override the configured options (:func:`call_reward`)."""
        fn = self.fn
        if isinstance(fn, functools.partial) and not fn.args:
            return call_reward(fn.func, prompts, completions, dict(fn.keywords), columns)
        return call_reward(fn, prompts, completions, {}, columns)


def check_options(spec: str, fn: RewardFn, options: dict[str, Any]) -> None:
    """Raise ``ValueError`` if ``options`` cannot be bound to ``fn`` (see :func:`register_reward`)."""
    if not isinstance(options, dict):
        raise ValueError(f"reward function {spec!r}: kwargs must be a mapping, got {type(options).__name__}")
    for key in options:
        if key in _RESERVED:
            raise ValueError(f"reward function {spec!r}: {key!r} cannot be set in kwargs")
    entry = _REGISTRY.get(spec.strip()) if ":" not in spec else None
    named = _named_params(fn)
    if named is not None:
        if entry is not None or not _accepts_var_kwargs(fn):
            unknown = sorted(set(options) - named)
            if unknown:
                raise ValueError(f"reward function {spec!r}: unknown option(s) {', '.join(unknown)} "
                                 f"(accepted: {', '.join(sorted(named)) or 'none'})")
    if entry is not None and entry.validate is not None:
        try:
            entry.validate(**options)
        except ValueError as e:
            raise ValueError(f"reward function {spec!r}: {e}") from e


def build_reward_fns(functions: Iterable[Any]) -> list[NamedReward]:
    """Resolve ``RewardFnConfig`` entries (or dicts with the same keys) into :class:`NamedReward`.

    Names (``name`` or the spec's last component) must be unique; options are checked here.
    """
    out: list[NamedReward] = []
    seen: dict[str, str] = {}
    for item in functions:
        cfg = _as_mapping(item)
        spec = cfg["fn"]
        fn = get_reward_fn(spec)
        options = dict(cfg.get("kwargs") or {})
        check_options(spec, fn, options)
        name = cfg.get("name") or default_name(spec)
        if name in seen:
            raise ValueError(f"duplicate reward name {name!r} (from {seen[name]!r} and {spec!r}); "
                             f"give one of them a distinct 'name'")
        seen[name] = spec
        out.append(NamedReward(name=name, fn=functools.partial(fn, **options),
                               weight=float(cfg.get("weight", 1.0))))
    return out


def _as_mapping(item: Any) -> dict[str, Any]:
    if isinstance(item, dict):
        if "fn" not in item:
            raise ValueError(f"reward function entry {item!r} has no 'fn'")
        return item
    return {"fn": item.fn, "name": item.name, "weight": item.weight, "kwargs": item.kwargs}
