"""Placement groups on Ray: create the groups the plan (``grpo_dist.config.placement``) asks for,
check them per node against the live cluster, wait for them with a bound.

Ray reschedules the bundles of a lost node onto the remaining nodes when they have room; the
actor replaced at that bundle index (``cluster/recovery.py``) lands wherever Ray put it.
"""

from __future__ import annotations

import logging
import time
import uuid
from dataclasses import dataclass
from typing import Any

from grpo_dist.config import Config
from grpo_dist.config.placement import (ActorSpec, GroupPlan, PlacementError, fmt_resources, actor_specs, check_feasible,
                                        describe_nodes, plan)

log = logging.getLogger("grpo_dist.cluster")

__all__ = ["ActorSpec", "GroupPlan", "Placement", "PlacementError", "actor_specs", "check_feasible", "cluster_nodes",
           "place", "plan"]


def cluster_nodes() -> tuple[dict[str, dict[str, float]], dict[str, dict[str, float]]]:
    """(total, free) resources of every alive node, by node id."""
    import ray

    totals = {n["NodeID"]: dict(n.get("Resources", {})) for n in ray.nodes() if n.get("Alive")}
    try:
        from ray._private.state import available_resources_per_node

        free = {k: v for k, v in available_resources_per_node().items() if k in totals}
    except Exception:  # pragma: no cover - private API moved: report totals only
        free = {}
    return totals, free


# ------------------------------------------------------------------------------------ creation


@dataclass
class Placement:
    """The created placement groups; ``strategy(role, index)`` is the scheduling strategy of actor
    ``index`` of ``role``."""

    groups: dict[str, Any]  # plan name -> PlacementGroup
    plans: dict[str, GroupPlan]

    def _group_of(self, role: str) -> str:
        return next(name for name, p in self.plans.items() if role in p.roles)

    def strategy(self, role: str, index: int):
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        name = self._group_of(role)
        return PlacementGroupSchedulingStrategy(
            placement_group=self.groups[name], placement_group_bundle_index=index % len(self.plans[name].bundles),
            placement_group_capture_child_tasks=False)

    def remove(self) -> None:
        from ray.util.placement_group import remove_placement_group

        for pg in self.groups.values():
            try:
                remove_placement_group(pg)
            except Exception:  # pragma: no cover - cluster already gone
                pass
        self.groups = {}


def place(cfg: Config, *, poll_s: float = 10.0) -> Placement:
    """Check feasibility per node, create every group, wait (bounded) until all are placed."""
    import ray
    from ray.util.placement_group import placement_group

    groups = plan(cfg)
    totals, free = cluster_nodes()
    check_feasible(groups, totals, free)
    tag = uuid.uuid4().hex[:8]
    created = {g.name: placement_group(g.bundles, strategy=g.strategy, name=f"grpo_dist-{tag}-{g.name}")
               for g in groups if g.bundles}
    placement = Placement(created, {g.name: g for g in groups if g.bundles})
    pending = {name: pg.ready() for name, pg in created.items()}
    deadline = time.monotonic() + cfg.cluster.placement_timeout_s
    while pending:
        left = deadline - time.monotonic()
        ready, _ = ray.wait(list(pending.values()), num_returns=len(pending), timeout=max(0.0, min(poll_s, left)))
        done = {r.hex() for r in ready}
        pending = {n: r for n, r in pending.items() if r.hex() not in done}
        if not pending:
            break
        waiting = ", ".join(f"{n} ({len(placement.plans[n].bundles)} x {fmt_resources(placement.plans[n].bundles[0])}, "
                            f"{placement.plans[n].strategy})" for n in pending)
        nodes = describe_nodes(*cluster_nodes())
        if time.monotonic() >= deadline:
            from grpo_dist.cluster.ray_utils import ClusterError

            placement.remove()
            raise ClusterError(f"cluster: placement groups {waiting} not placed within "
                                 f"cluster.placement_timeout_s={cfg.cluster.placement_timeout_s:g} s ({nodes})")
        log.warning("waiting for placement groups %s; %s", waiting, nodes)
    return placement
