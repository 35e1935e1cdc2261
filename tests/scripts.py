"""Loading a script that is not a package module (benchmarks/*.py, docs/hooks/*.py) in a test."""

from __future__ import annotations

import importlib.util
import os
import sys
from types import ModuleType


def load_script(path: str | os.PathLike, name: str | None = None) -> ModuleType:
    """A fresh module run from the file ``path`` (each call loads it again), registered in
    ``sys.modules`` under ``name`` (default: the file's stem) while it runs: a dataclass in it
    looks its module up there."""
    name = name or os.path.splitext(os.path.basename(path))[0]
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod
