"""A Python callable where the config names a function: the Python API's closures, lambdas and
objects with ``__call__`` (``GRPOTrainer(reward_funcs=[fn])``, docs/python-api.md).

:func:`spec_of` turns a callable into what ``reward.functions[i].fn`` holds:

* a function an actor can import by name (a module-level function of an installed package, the
  standard library or grpo_dist) becomes its plain spec ``module:qualname``, as a YAML config
  would name it (``config.yaml`` can be run again with the CLI);
* anything else (a notebook's or a script's ``__main__``, a closure, a lambda, an instance, a
  function of a module that is no installed package: a test module, a file beside the script)
  becomes a :class:`CallableSpec`: a ``str`` (its label, ``<callable module.qualname #hash>``, is
  what ``config.yaml``, the W&B config and messages show, and the hash of its pickle keys the
  pre-flight and evaluation caches, so an edited closure is another function) that carries the
  callable. It travels to the Ray actors *by value*: pickled once with cloudpickle, its module
  registered by value (Ray passes a driver's functions by reference, and the actors' processes
  cannot import ``__main__`` or a module off their path); an actor unpickles it when it asks for
  :attr:`CallableSpec.fn` (the reward actors), never merely for holding the config (engines,
  learner).

The pickle is made when the spec is: a callable that cannot be pickled (a lock, an open file in
its closure) fails in the config, in one line, before any actor starts; what it closes over is
taken as it is then.
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import pickle
import sys
import sysconfig
import threading
from pathlib import Path
from typing import Any

LABEL = "<callable "
_LOCK = threading.Lock()  # cloudpickle's by-value registry is global


class CallableSpec(str):
    """A callable as a config spec string (see the module's docstring); ``fn`` is the callable,
    ``name`` its ``__name__`` (the default reward name)."""

    _fn: Any
    _payload: bytes
    name: str

    def __new__(cls, fn: Any = None, *, _label: str = "", _payload: bytes = b"", _name: str = ""):
        if fn is None:  # unpickled in an actor: the payload, loaded on first use
            self = super().__new__(cls, _label)
            self._fn, self._payload, self.name = None, _payload, _name
            return self
        payload = _dumps(fn)
        name = callable_name(fn)
        self = super().__new__(cls, f"{LABEL}{_where(fn)} #{hashlib.sha256(payload).hexdigest()[:10]}>")
        self._fn, self._payload, self.name = fn, payload, name
        return self

    @property
    def fn(self) -> Any:
        if self._fn is None:
            self._fn = pickle.loads(self._payload)
        return self._fn

    def __reduce__(self):
        return _restore, (str(self), self._payload, self.name)

    def __copy__(self) -> CallableSpec:
        return self

    def __deepcopy__(self, memo: dict) -> CallableSpec:
        return self


def _restore(label: str, payload: bytes, name: str) -> CallableSpec:
    return CallableSpec(_label=label, _payload=payload, _name=name)


def callable_name(fn: Any) -> str:
    """``__name__`` of a function (a partial's function's), else the class name of an instance."""
    while isinstance(fn, functools.partial):
        fn = fn.func
    return getattr(fn, "__name__", None) or type(fn).__name__


def _where(fn: Any) -> str:
    inner = fn.func if isinstance(fn, functools.partial) else fn
    qual = getattr(inner, "__qualname__", None) or f"{type(inner).__qualname__} instance"
    return f"{getattr(inner, '__module__', None) or type(inner).__module__}.{qual}"


def is_label(spec: Any) -> bool:
    """``spec`` is a callable's label read back from a file (the callable itself is not there)."""
    return isinstance(spec, str) and not isinstance(spec, CallableSpec) and spec.startswith(LABEL)


def _roots() -> list[Path]:
    paths = sysconfig.get_paths()
    roots = {Path(paths[k]).resolve() for k in ("stdlib", "platstdlib", "purelib", "platlib") if k in paths}
    return sorted(roots | {Path(__file__).resolve().parents[1]})  # grpo_dist itself (an editable install)


def installed(module_name: str | None) -> bool:
    """The module comes with an installed package, the standard library or grpo_dist: the actors'
    processes import it as the driver does."""
    mod = sys.modules.get(module_name or "")
    if mod is None or module_name == "__main__":
        return False
    file = getattr(mod, "__file__", None)
    if file is None:  # a builtin module
        return True
    path = Path(file).resolve()
    return any(path.is_relative_to(r) for r in _roots())


def by_name(fn: Any) -> str | None:
    """``module:qualname`` when an actor can import ``fn`` by that name, else None."""
    module, qual = getattr(fn, "__module__", None), getattr(fn, "__qualname__", None)
    if not (module and qual) or "<" in qual or not installed(module):
        return None
    try:
        obj: Any = importlib.import_module(module)
        for part in qual.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError):
        return None
    return f"{module}:{qual}" if obj is fn else None


def spec_of(fn: Any) -> str:
    """What the config holds for the callable ``fn``: its ``module:qualname``, or a
    :class:`CallableSpec`; ``ValueError`` (one line) when it cannot travel."""
    if isinstance(fn, CallableSpec):
        return fn
    return by_name(fn) or CallableSpec(fn)


def _dumps(fn: Any) -> bytes:
    """``fn`` pickled by value: the modules it comes from (its function's, its class's) registered
    with cloudpickle for the call, unless installed."""
    import cloudpickle

    inner = fn.func if isinstance(fn, functools.partial) else fn
    names = {getattr(inner, "__module__", None), type(inner).__module__}
    mods = [sys.modules[n] for n in names if n and n != "__main__" and n in sys.modules and not installed(n)]
    with _LOCK:
        added = [m for m in mods if m.__name__ not in cloudpickle.list_registry_pickle_by_value()]
        for m in added:
            cloudpickle.register_pickle_by_value(m)
        try:
            return cloudpickle.dumps(fn)
        except Exception as e:  # noqa: BLE001 - what the closure holds: one line naming it
            raise ValueError(f"{_where(fn)} cannot be sent to the actors (cloudpickle: {type(e).__name__}: "
                             f"{str(e).splitlines()[0] if str(e) else ''})") from None
        finally:
            for m in added:
                cloudpickle.unregister_pickle_by_value(m)
