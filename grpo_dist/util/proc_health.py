"""The health of an actor's engine processes (psutil): stopped, exited or gone.

A rollout actor records the processes its engine started (vLLM's engine core and, on CPU, its
worker: the processes titled ``VLLM::...``) while the engine starts (:class:`StartWatch`) and once
it is up (:func:`engine_processes`); its heartbeat then reports any of them stopped (SIGSTOP, a
debugger), exited (a zombie not yet reaped) or gone (SIGKILL, the OOM killer): :func:`problems`.
Children that come and go (a compiler's workers, a reward sandbox, a tool call) are never recorded:
one that exits normally is no engine lost. :func:`cpu_seconds`: whether an engine computes.
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


def describe(found: list[tuple[int, str, str]]) -> str:
    """``problems``' answer as one phrase: "VLLM::EngineCore (pid 9) gone, ..."."""
    return ", ".join(f"{name} (pid {pid}) {state}" for pid, name, state in found)


class EngineProcessLost(RuntimeError):
    """An engine failed to start because one of its processes was stopped, killed or exited (the
    driver replaces the actor, as for an engine that dies later, rather than stopping the run)."""


def exited_on_its_own(e: BaseException) -> bool:
    """vLLM's "Engine core initialization failed ... Failed core proc(s): {'EngineCore': 1}": an
    engine process of the start exited with a positive code (it raised: a config it refuses),
    anywhere in the exception's chain. A signal shows as a negative code; an exit vLLM had not
    reaped yet shows as ``{}`` (as likely for a kill as for an error: not counted as its own)."""
    import ast
    import re

    while e is not None:
        m = re.search(r"Failed core proc\(s\): (\{[^}]*\})", str(e))
        if m:
            try:
                codes = ast.literal_eval(m.group(1))
            except (ValueError, SyntaxError):
                codes = {}
            if any(isinstance(c, int) and c > 0 for c in codes.values()):
                return True
        e = e.__cause__ or e.__context__
    return False


_CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _stat_cpu_s(path: str) -> Optional[float]:
    """utime + stime of a ``/proc/.../stat`` file, seconds (None: gone, or no procfs)."""
    try:
        with open(path, "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()  # after the name, which may hold spaces
        return (int(fields[11]) + int(fields[12])) / _CLK_TCK
    except (OSError, IndexError, ValueError):
        return None


def cpu_seconds(threads=(), processes=()) -> dict[tuple[str, int], float]:
    """CPU time (user + system, seconds, in clock ticks of 10 ms) of threads of this process (by
    native id) and of the main thread of processes, keyed ``("thread", tid)`` / ``("process",
    pid)``; those gone are left out, and everything off Linux (no ``/proc``). What an engine's
    progress reads while it works (``rollout.base.EngineProgress``): a stopped or blocked one uses
    none. A process's main thread only: an idle vLLM worker's helper threads wake now and then
    (13 of them, 0.12 s of CPU per 10 s idle, vLLM 0.32 CPU), its main thread runs the model."""
    out: dict[tuple[str, int], float] = {}
    for kind, ids, path in (("thread", threads, "/proc/self/task/{0}/stat"),
                            ("process", processes, "/proc/{0}/task/{0}/stat")):
        for i in ids:
            v = _stat_cpu_s(path.format(i))
            if v is not None:
                out[(kind, i)] = v
    return out


ENGINE_PREFIX = "VLLM::"  # the titles vLLM gives its engine core and workers (psutil's name: the first 15 chars)


def engine_processes(prefix: str = ENGINE_PREFIX) -> dict[int, str]:
    """The live processes below this one titled ``prefix...`` (the engine's), by pid, with their name."""
    return {pid: name for pid, name in descendants().items() if name.startswith(prefix)}


class StartWatch:
    """While an engine starts: every ``every`` s, the processes below this one named ``VLLM::...``
    are recorded into ``owner.engine_pids`` (a new dict each time: the heartbeat thread reads it),
    so a heartbeat during the start reports one stopped or gone -- a start waiting on a stopped
    worker would otherwise wait out the whole start timeout. Children that are not the engine's (a
    compiler inductor spawns) are never recorded. Use as a context manager around the start. A
    process killed within ``every`` s of taking its title is never seen: that start fails as a bug
    would (the run stops with its error)."""

    def __init__(self, owner, every: float = 0.1, prefix: str = ENGINE_PREFIX):
        import threading

        self.owner, self.every, self.prefix = owner, every, prefix
        self.seen: dict[int, str] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="engine-start-watch", daemon=True)

    def _look(self) -> None:
        new = {pid: name for pid, name in engine_processes(self.prefix).items() if pid not in self.seen}
        if new:
            self.seen = {**self.seen, **new}
            self.owner.engine_pids = dict(self.seen)

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            self._look()

    def lost(self) -> list[tuple[int, str, str]]:
        """The recorded engine processes now stopped, exited or gone."""
        self._look()
        return problems(self.seen)

    def __enter__(self) -> "StartWatch":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
