"""The health of an actor's engine processes (psutil): stopped, exited or gone.

A rollout actor records the processes its engine started (vLLM's engine core and, on CPU, its
worker) once the engine is up (:func:`descendants`); its heartbeat then reports any of them
stopped (SIGSTOP, a debugger), exited (a zombie not yet reaped) or gone (SIGKILL, the OOM killer):
:func:`problems`. Children that come and go (a reward sandbox, a tool call) are never recorded.
"""

from __future__ import annotations

import os
from typing import Optional

import psutil

_STOPPED = {psutil.STATUS_STOPPED, getattr(psutil, "STATUS_TRACING_STOP", "tracing-stop")}
_GONE = {psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD}


def descendants(pid: Optional[int] = None) -> dict[int, str]:
    """Every live process below ``pid`` (default: this one), by pid, with its name."""
    out = {}
    try:
        kids = psutil.Process(pid or os.getpid()).children(recursive=True)
    except psutil.NoSuchProcess:
        return out
    for p in kids:
        try:
            if p.status() not in _GONE:
                out[p.pid] = p.name()
        except psutil.NoSuchProcess:
            continue
    return out


def problems(watched: dict[int, str]) -> list[tuple[int, str, str]]:
    """``(pid, name, state)`` for each watched process that is stopped, exited or gone (state one
    of ``"stopped"``, ``"exited"``, ``"gone"``); [] when all of them run."""
    bad = []
    for pid, name in sorted(watched.items()):
        try:
            status = psutil.Process(pid).status()
        except psutil.NoSuchProcess:
            bad.append((pid, name, "gone"))
            continue
        if status in _STOPPED:
            bad.append((pid, name, "stopped"))
        elif status in _GONE:
            bad.append((pid, name, "exited"))
    return bad
