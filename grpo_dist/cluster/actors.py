"""What every actor of this project can do besides its own work, and where actors run.

The workers (RolloutWorker, RewardWorker, Learner) are plain classes; ``grpo_dist.run.workers``
builds the three groups from them with :class:`Placed` mixed in, through
``ActorGroup.create`` (``ray_utils.py``: the one place an actor class becomes a Ray actor).
"""

from __future__ import annotations

import os
from typing import Any, Callable

import ray

from grpo_dist.cluster.ray_utils import ActorGroup
from grpo_dist.util.ports import free_port


HEALTH_GROUP = "health"  # the Ray concurrency group of ``heartbeat``: it answers while the actor works


class Placed:
    """Mixin of every actor: where it runs (for learner rendezvous, placement checks and logs),
    and whether it is alive (:meth:`heartbeat`)."""

    engine_pids: dict[int, str] = {}  # processes the actor's engine started (set once it is up)

    @ray.method(concurrency_group=HEALTH_GROUP)
    def heartbeat(self) -> dict:
        """Answered in its own thread while the actor's calls run: this process answers, and
        ``problems`` lists each engine process (``engine_pids``) stopped, exited or gone, as
        ``(pid, name, state)``; ``stalled_s``: how long the engine's call in flight has not moved
        (a rollout worker's ``engine_stalled_s``; 0 otherwise). The driver polls it while it waits
        (``ActorGroup.get``)."""
        from grpo_dist.util.proc_health import problems

        stalled = getattr(self, "engine_stalled_s", None)
        return {"pid": os.getpid(), "problems": problems(self.engine_pids),
                "stalled_s": float(stalled()) if callable(stalled) else 0.0}

    @ray.method(concurrency_group=HEALTH_GROUP)
    def kill_engine(self) -> list[int]:
        """SIGKILL every engine process (before the actor is replaced: a stopped one would
        otherwise outlive it); the pids signalled."""
        import signal

        killed = []
        for pid in list(self.engine_pids):
            try:
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
            except OSError:  # gone already
                pass
        self.engine_pids = {}
        return killed

    def node_info(self) -> dict:
        return {"ip": ray.util.get_node_ip_address(), "pid": os.getpid(),
                "node_id": ray.get_runtime_context().get_node_id(), "gpu_ids": [str(g) for g in ray.get_gpu_ids()]}

    def rendezvous_address(self) -> dict:
        """This node's IP and a port free on it (the learner's rank 0 is asked)."""
        ip = ray.util.get_node_ip_address()
        return {"ip": ip, "port": free_port(ip)}

    def peak_rss(self) -> dict[str, int]:
        """This actor process's peak resident set and its child processes' (bytes)."""
        from grpo_dist.util.memory import peak_rss

        return peak_rss()

    def debug_call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """The one test and fault-injection hook: run ``fn(worker, *args, **kwargs)`` inside this
        actor on its plain worker object and return the result. Training never calls it; the
        functions tests pass live in ``grpo_dist.testing``."""
        return fn(self, *args, **kwargs)


def on_nodes(group: ActorGroup, timeout: float) -> tuple[list[tuple[int, int]], list[str]]:
    """For each actor of ``group``: (its index among the group's actors on its node, how many
    share that node); and each actor's node id."""
    nodes = [n["node_id"] for n in group.get(group.call("node_info"), timeout=timeout)]
    return [(nodes[:i].count(n), nodes.count(n)) for i, n in enumerate(nodes)], nodes
