"""Loading a user's object from a config spec: ``package.module:attr`` or ``path/to/file.py:attr``.

Shared by reward functions and environments. A module is imported with :mod:`importlib` (it must
be importable, e.g. on ``PYTHONPATH``); a file is loaded as a module once per process (relative
paths are relative to the current directory); ``attr`` may be dotted (``module:Class.method``).
Every failure is a ``ValueError`` naming the spec.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import sys
import threading
from pathlib import Path
from typing import Any, Callable

_FILE_MODULES: dict[Path, Any] = {}
_LOCK = threading.Lock()


def load_object(spec: str, kind: str, attr_kind: str = "object") -> tuple[Any, str]:
    """The object ``spec`` names and where it was found (for messages); ``kind`` names what the
    spec is for in messages ("reward function", "environment")."""
    target, _, attr = spec.rpartition(":")
    if not target or not attr:
        raise ValueError(f"bad {kind} spec {spec!r}: expected 'module.path:{attr_kind}' "
                         f"or 'path/to/file.py:{attr_kind}'")
    if target.endswith(".py") or "/" in target or "\\" in target:
        path = Path(target).expanduser().resolve()
        module = _load_file(spec, kind, path)
        where = f"file {str(path)!r}"
    else:
        module = _import_module(spec, kind, target)
        where = f"module {target!r}"
    obj: Any = module
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            public = sorted(n for n, v in vars(module).items() if callable(v) and not n.startswith("_"))
            raise ValueError(f"{kind} {spec!r}: {where} has no attribute {attr!r} "
                             f"(callables there: {', '.join(public[:20]) or 'none'})") from None
    return obj, where


def load_function(spec: str, kind: str) -> Callable[..., Any]:
    """The callable ``spec`` names (``module:fn`` / ``file.py:fn``); ValueError naming ``kind`` and it."""
    fn, where = load_object(spec, kind, "function")
    if not callable(fn):
        raise ValueError(f"{kind} {spec!r}: {where} attribute is not callable")
    return fn


def _import_module(spec: str, kind: str, name: str) -> Any:
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as e:
        missing = e.name or ""
        if missing and (name == missing or name.startswith(missing + ".")):
            raise ValueError(f"{kind} {spec!r}: module {name!r} not found "
                             f"(is it installed or on PYTHONPATH?)") from e
        raise ValueError(f"{kind} {spec!r}: importing module {name!r} failed: {e}") from e
    except Exception as e:  # the plug-in itself is broken (syntax error, raising import, ...)
        raise ValueError(f"{kind} {spec!r}: importing module {name!r} failed: "
                         f"{type(e).__name__}: {e}") from e


def _load_file(spec: str, kind: str, path: Path) -> Any:
    if not path.is_file():
        raise ValueError(f"{kind} {spec!r}: file {str(path)!r} not found")
    with _LOCK:
        module = _FILE_MODULES.get(path)
        if module is not None:
            return module
        digest = hashlib.sha1(str(path).encode()).hexdigest()[:10]
        mod_name = f"grpo_dist_plugin_{_identifier(path.stem)}_{digest}"
        try:
            mspec = importlib.util.spec_from_file_location(mod_name, path)
            if mspec is None or mspec.loader is None:
                raise ImportError("not a loadable Python file")
            module = importlib.util.module_from_spec(mspec)
            sys.modules[mod_name] = module  # before exec: dataclasses/pickle look modules up here
            mspec.loader.exec_module(module)
        except Exception as e:
            sys.modules.pop(mod_name, None)
            raise ValueError(f"{kind} {spec!r}: loading file {str(path)!r} failed: "
                             f"{type(e).__name__}: {e}") from e
        _FILE_MODULES[path] = module
        return module


def _identifier(s: str) -> str:
    return "".join(c if c.isalnum() or c == "_" else "_" for c in s)
