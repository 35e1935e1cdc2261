"""A silent actor's node: answering, or lost (its link down, its machine gone)?

Ray marks a node dead only once its health checks have failed for a while (tens of seconds at
Ray's defaults), and until then a placement-group bundle there stays there. The heartbeat can find
a silent actor sooner; a replacement created at once would then be placed on the lost node and die
with it, costing a restart (on netns hosts: 4 restarts instead of 3 for a host holding two engines
and the reward actor, one more than the default budget). So before a silent actor is replaced, its
node is asked to run a zero-CPU task, and the replacement waits until the node answers (however
late: a loaded node starts the task's worker slowly) or Ray marks it dead and moves its bundles
(at most ``probe_s + wait_s``, then the replacement goes ahead). A warning says so after ``probe_s``.
A stop request (the first Ctrl-C) ends the wait within a second: the run then stops instead of
replacing the actor.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Optional

from grpo_dist.cluster.ray_utils import stop_requested_at

log = logging.getLogger("grpo_dist.cluster")
PROBE_S = 10.0
WAIT_S = 120.0


def _answer() -> bool:
    return True


def node_of(actor: Any) -> Optional[str]:
    """The node id Ray's actor table gives for ``actor`` (None if it cannot say)."""
    try:
        from ray._private.state import state

        return state.actor_table(actor._actor_id.hex())["Address"]["NodeID"] or None
    except Exception:  # an old or new Ray without this table entry: no wait, as before
        return None


def _cancel(ref: Any) -> None:
    import ray

    try:
        ray.cancel(ref, force=True)
    except Exception:  # already finished, or its node is gone: nothing left to cancel
        pass


def _alive(node_id: str) -> bool:
    import ray

    return any(n["NodeID"] == node_id and n.get("Alive") for n in ray.nodes())


def await_lost_node(actor: Any, what: str, probe_s: float = PROBE_S, wait_s: float = WAIT_S) -> str:
    """Before replacing the silent ``actor`` (``what`` names it): ``"alive"`` once its node runs a
    zero-CPU task (the wait ends the moment it does, however late), ``"dead"`` once Ray has marked
    the node dead (at once, or while waiting; a warning after ``probe_s`` without an answer),
    ``"unknown"`` if Ray cannot say where the actor ran, or after ``probe_s + wait_s``;
    ``"stopped"`` when a stop was requested (before or while it waits: answered within a second)."""
    if stop_requested_at() is not None:
        return "stopped"
    node = node_of(actor)
    if node is None:
        return "unknown"
    if not _alive(node):
        return "dead"
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    task = ray.remote(num_cpus=0, max_retries=0)(_answer)
    ref = task.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False)).remote()
    start, warned = time.monotonic(), False
    while time.monotonic() < start + probe_s + wait_s:
        ready, _ = ray.wait([ref], timeout=0.5)
        if stop_requested_at() is not None:
            _cancel(ref)
            return "stopped"
        if ready:  # answered, however late (a loaded node starts the task's worker slowly): no more waiting
            try:
                ray.get(ref)
                return "alive"
            except Exception:  # the task failed: the node died meanwhile, or Ray cannot say
                return "dead" if not _alive(node) else "unknown"
        if not _alive(node):
            _cancel(ref)
            return "dead"
        if not warned and time.monotonic() > start + probe_s:
            warned = True
            log.warning("%s: its node %s does not answer either: waiting for Ray to mark it dead (at most %g s) so "
                        "that the replacement is placed on another node", what, node[:8], wait_s)
    _cancel(ref)
    log.warning("%s: Ray still counts node %s alive after %g s; replacing anyway", what, node[:8], wait_s)
    return "unknown"
