"""Replacing dead rollout and reward actors mid-run.

A rollout or reward actor whose process is gone (node lost, OOM-killed, preempted), whose engine
process is stopped or gone (its heartbeat says so), or that is silent (no heartbeat for
``cluster.heartbeat_timeout_s``, or no answer within ``rollout.generate_timeout_s``: it is killed), is replaced
by a fresh one at the same rank: set up, brought to the learner's current weights, and the
dispatch that failed is issued again. At most ``cluster.max_restarts`` replacements per run;
every one is logged as a warning and counted in ``cluster/restarts``. Not replaced:

* an actor that *raised* (a bug; retrying would repeat it) -- the run stops with its error;
* any actor found silent or dead after a stop was requested (Ctrl-C): the run stops at once;
* a learner rank (its DeepSpeed process group cannot take a newcomer) -- the run stops and
  ``checkpoint.resume: auto`` continues from the last checkpoint.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Optional, TypeVar

from grpo_dist.cluster.actors import on_nodes
from grpo_dist.cluster.node_loss import await_lost_node
from grpo_dist.cluster.ray_utils import ClusterError
from grpo_dist.config import Config

log = logging.getLogger("grpo_dist.cluster")
T = TypeVar("T")
REPLACEABLE = ("rollout", "reward")


class Recovery:
    def __init__(self, cfg: Config, workers, on_replace: Optional[Callable[[int, Any, float], None]] = None):
        """``on_replace(rank, actor, timeout)``: brings a replaced (set-up) rollout engine to the
        learner's newest weights (``WeightSync.on_replace``)."""
        self.cfg, self.workers, self.on_replace = cfg, workers, on_replace
        self.restarts = 0

    def run(self, fn: Callable[..., T], *args, **kwargs) -> T:
        """``fn(*args)`` (a dispatch over the rollout / reward groups), again after replacing a
        dead actor, as long as restarts are left."""
        while True:
            try:
                return fn(*args, **kwargs)
            except ClusterError as e:
                self.handle(e)

    def handle(self, e: ClusterError) -> None:
        """Replace the dead actor ``e`` names, or re-raise ``e`` when that is not possible. A
        replacement that dies or hangs while it starts (its engine process killed or stopped) is
        replaced again, within the same budget."""
        limit = self.cfg.cluster.max_restarts
        while True:
            if not (e.dead or e.hung) or e.role not in REPLACEABLE or e.rank is None or e.interrupted:
                raise e
            if self.restarts >= limit:
                raise ClusterError(f"{e} (cluster.max_restarts={limit} replacements used up)",
                                   e.role, e.rank, dead=e.dead, hung=e.hung) from e
            self.restarts += 1
            log.warning("%s -- replacing it (restart %d of %d) and re-issuing its work", e, self.restarts, limit)
            try:
                self.replace(e.role, e.rank, silent=e.hung)
                return
            except ClusterError as again:
                e = again

    def _engine_place(self, rank: int) -> tuple[int, int, int]:
        """Rollout engine ``rank``'s (engines on its node, its index there, learner ranks there),
        as ``start_workers`` passes them to ``setup`` (the CPUs it binds); (1, 0, 0) if unknown."""
        try:
            timeout = self.cfg.cluster.actor_start_timeout_s
            engines, nodes = on_nodes(self.workers.rollout, timeout)
            (index, count), node = engines[rank], nodes[rank]
            return count, index, on_nodes(self.workers.learner, timeout)[1].count(node)
        except Exception as e:  # another actor down too: the engine binds to all its node's CPUs
            log.warning("placing rollout engine %d's CPUs: %s", rank, e)
            return 1, 0, 0

    def replace(self, role: str, rank: int, silent: bool = False) -> None:
        """A fresh actor at ``rank``; for a ``silent`` one, once its node has answered or Ray has
        marked the node dead (``node_loss``: else the replacement could land on a lost node)."""
        w, timeout = self.workers, self.cfg.cluster.actor_start_timeout_s
        group = w.rollout if role == "rollout" else w.reward
        if silent and await_lost_node(group.actors[rank], f"{role} worker {rank}") == "stopped":
            raise ClusterError(f"{role} worker {rank}: silent, and a stop was requested while its node was probed; "
                               f"not replaced", role, rank, hung=True, interrupted=True)
        actor = group.replace(rank)
        if role == "reward":
            group.get([actor.names.remote()], timeout=timeout, ranks=[rank])
            return
        group.get([actor.setup.remote(*self._engine_place(rank))], timeout=timeout, ranks=[rank])
        if self.on_replace is not None:
            self.on_replace(rank, actor, timeout)
