"""A vLLM general plugin (entry point ``vllm.general_plugins``): vLLM loads it in every process it
starts (the engine core and its worker processes), which is the only way to change how a spawned
vLLM worker behaves from outside.

What it changes, each only where the rollout worker asked for it in the environment (a user's
other vLLM runs on the machine are left alone):

* ``GRPO_DIST_VLLM_QUIET_RELOAD`` (merged/full-weight engines): vLLM 0.26's per-reload
  "Following weights were not loaded" notice is dropped (``vllm_compat.NotLoadedFilter``; 0.32
  logs it from a logger that ``VLLM_LOGGING_CONFIG_PATH`` quiets).
* ``GRPO_DIST_VLLM_IDLE_SPIN_S`` (CPU engines): how long a vLLM worker keeps polling its
  shared-memory request queue after the last request before it waits on a socket. vLLM (0.26 and
  0.32 alike) polls (``sched_yield`` in a loop) for 1 s after each read. On a GPU box that is a
  spare host core; on a CPU node it is one of the cores the learner needs next: after every
  generation call each engine's worker burns a full core for that second while the learner's
  reference pass and update run (benchmarks/NOTES.md has the measurement). A short window still
  covers the gaps between decode steps of one call; after it the worker sleeps on the queue's
  notify socket, which the writer signals on every message, so a new request wakes it at once.
"""

from __future__ import annotations

import functools
import inspect
import os

from grpo_dist.rollout import vllm_compat

ENV = "GRPO_DIST_VLLM_IDLE_SPIN_S"
CPU_IDLE_SPIN_S = 0.05  # what the rollout worker exports for CPU engines (vLLM's own default: 1 s)


def idle_spin_s() -> float | None:
    """The busy-poll window asked for through :data:`ENV`, or None (unset / not a number >= 0)."""
    raw = os.environ.get(ENV)
    try:
        value = float(raw) if raw not in (None, "") else None
    except ValueError:
        return None
    return value if value is not None and value >= 0 else None


def register() -> None:
    """The plugin entry point: loaded by vLLM in each of its processes (more than once is fine)."""
    spin = idle_spin_s()
    if spin is not None:
        patch_spin_condition(spin)
    if os.environ.get(vllm_compat.QUIET_RELOAD_ENV):  # merged/full-weight engines (vllm_engine.py)
        vllm_compat.install_not_loaded_filter()


def patch_spin_condition(spin: float) -> bool:
    """Make vLLM's shared-memory readers poll for ``spin`` s instead of their default; returns
    whether vLLM has the class to patch (a later vLLM without it is left as it is)."""
    try:
        from vllm.distributed.device_communicators import shm_broadcast
    except Exception:  # pragma: no cover - vLLM missing or broken: nothing to patch
        return False
    cls = getattr(shm_broadcast, "SpinCondition", None)
    if cls is None or "busy_loop_s" not in inspect.signature(cls.__init__).parameters:
        return False
    init = getattr(cls.__init__, "__wrapped__", cls.__init__)  # patch once, keep the newest value

    @functools.wraps(init)
    def __init__(self, *args, **kwargs):
        kwargs.setdefault("busy_loop_s", spin)
        init(self, *args, **kwargs)

    cls.__init__ = __init__
    return True
