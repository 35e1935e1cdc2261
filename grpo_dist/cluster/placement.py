"""Placement groups: one per role, bundles from the config, checked per node before anything starts.

Roles and bundles (``cluster.layout``):

* ``disaggregated`` -- three groups: ``learner`` (``num_learners`` bundles of ``learner_cpus`` /
  ``learner_gpus`` / ``learner_resources``), ``rollout`` (one bundle per engine) and ``reward``.
* ``colocated`` -- learner rank i and rollout engine i share bundle i of one ``learner+rollout``
  group (the bundle holds the sum of both actors' resources); reward keeps its own group.

Each group has its own strategy (``cluster.<role>_strategy``). Before any group is created the
plan is checked against every alive node's *total* resources: a bundle that no node can hold, a
STRICT_PACK group that fits no single node, a STRICT_SPREAD group with fewer capable nodes than
bundles, or a demand above the cluster's totals is a :class:`PlacementError` (one line naming the
bundle and the nodes' free resources; the CLI exits 2). A feasible plan on a busy cluster waits
up to ``cluster.placement_timeout_s``, logging what it waits for every few seconds, then stops
with a ClusterError.

Ray reschedules the bundles of a lost node onto the remaining nodes when they have room; the
actor replaced at that bundle index (``cluster/recovery.py``) lands wherever Ray put it.
"""

from __future__ import annotations

import logging
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Optional

from grpo_dist.config import Config, ConfigError

log = logging.getLogger("grpo_dist.cluster")

EPS = 1e-9


class PlacementError(ConfigError):
    """No node layout can hold the request (one line; the CLI exits 2 before any actor starts)."""


@dataclass(frozen=True)
class ActorSpec:
    """What one actor of a role asks for (a subset of its bundle)."""

    num_cpus: float
    num_gpus: float = 0.0
    resources: dict[str, float] = field(default_factory=dict)

    def as_bundle(self) -> dict[str, float]:
        b = {"CPU": self.num_cpus, **self.resources}
        if self.num_gpus:
            b["GPU"] = self.num_gpus
        return {k: float(v) for k, v in b.items() if v}


@dataclass
class GroupPlan:
    name: str  # "learner", "rollout", "reward" or "learner+rollout"
    bundles: list[dict[str, float]]
    strategy: str
    roles: tuple[str, ...]  # the roles whose actors live in this group


def actor_specs(cfg: Config) -> dict[str, ActorSpec]:
    c = cfg.cluster
    return {"learner": ActorSpec(c.learner_cpus, c.learner_gpus, dict(c.learner_resources)),
            "rollout": ActorSpec(c.rollout_cpus, c.rollout_gpus, dict(c.rollout_resources)),
            "reward": ActorSpec(c.reward_cpus, 0.0, dict(c.reward_resources))}


def _add(a: dict[str, float], b: dict[str, float]) -> dict[str, float]:
    out = dict(a)
    for k, v in b.items():
        out[k] = out.get(k, 0.0) + v
    return out


def plan(cfg: Config) -> list[GroupPlan]:
    """The placement groups this config asks for (pure: no Ray)."""
    c, spec = cfg.cluster, actor_specs(cfg)
    k, n, m = cfg.learner.num_learners, cfg.rollout.num_workers, cfg.reward.num_workers
    groups: list[GroupPlan] = []
    if c.layout == "colocated":
        shared = _add(spec["learner"].as_bundle(), spec["rollout"].as_bundle())
        groups.append(GroupPlan("learner+rollout", [dict(shared) for _ in range(k)], c.learner_strategy,
                                ("learner", "rollout")))
    else:
        groups.append(GroupPlan("learner", [spec["learner"].as_bundle() for _ in range(k)], c.learner_strategy,
                                ("learner",)))
        groups.append(GroupPlan("rollout", [spec["rollout"].as_bundle() for _ in range(n)], c.rollout_strategy,
                                ("rollout",)))
    groups.append(GroupPlan("reward", [spec["reward"].as_bundle() for _ in range(m)], c.reward_strategy, ("reward",)))
    return groups


# ------------------------------------------------------------------------------------ feasibility


def _fits(bundle: dict[str, float], node: dict[str, float]) -> bool:
    return all(node.get(r, 0.0) + EPS >= v for r, v in bundle.items())


def _fmt(res: dict[str, float]) -> str:
    keep = {k: v for k, v in res.items() if not k.startswith("node:") and not k.endswith("memory")
            and k != "accelerator_type" and not k.startswith("accelerator_type:")}
    return "{" + ", ".join(f"{k}: {v:g}" for k, v in sorted(keep.items())) + "}"


def describe_nodes(totals: dict[str, dict[str, float]], free: Optional[dict[str, dict[str, float]]] = None) -> str:
    free = free or {}
    return "; ".join(f"node {nid[:8]} free {_fmt(free.get(nid, tot))} of {_fmt(tot)}" for nid, tot in totals.items())


def check_feasible(groups: list[GroupPlan], totals: dict[str, dict[str, float]],
                   free: Optional[dict[str, dict[str, float]]] = None) -> None:
    """Raise :class:`PlacementError` if no packing of ``groups`` onto nodes with ``totals`` exists
    (conservative: only requests that are certainly impossible fail; a feasible-looking one that
    a smarter packing would need is left to Ray and the bounded wait)."""
    nodes = describe_nodes(totals, free)
    for g in groups:
        for i, b in enumerate(g.bundles):
            if not any(_fits(b, t) for t in totals.values()):
                raise PlacementError(f"cluster: bundle {i} of the {g.name} group {_fmt(b)} fits on no node "
                                     f"({nodes})")
        if g.strategy == "STRICT_PACK":
            need = {}
            for b in g.bundles:
                need = _add(need, b)
            if not any(_fits(need, t) for t in totals.values()):
                raise PlacementError(f"cluster: the {g.name} group ({len(g.bundles)} x {_fmt(g.bundles[0])}, "
                                     f"STRICT_PACK) fits on no single node ({nodes})")
        if g.strategy == "STRICT_SPREAD":
            capable = sum(1 for t in totals.values() if _fits(g.bundles[0], t)) if g.bundles else 0
            if capable < len(g.bundles):
                raise PlacementError(f"cluster: the {g.name} group (STRICT_SPREAD) needs {len(g.bundles)} nodes "
                                     f"that each hold {_fmt(g.bundles[0])}, the cluster has {capable} ({nodes})")
    demand: dict[str, float] = {}
    for g in groups:
        for b in g.bundles:
            demand = _add(demand, b)
    have: dict[str, float] = {}
    for t in totals.values():
        have = _add(have, t)
    for r, v in sorted(demand.items()):
        if v > have.get(r, 0.0) + EPS:
            raise PlacementError(f"cluster: the actors need {v:g} {r} in all, the cluster has {have.get(r, 0.0):g} "
                                 f"({nodes}; lower cluster.*_cpus/_gpus or the worker counts)")


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
        waiting = ", ".join(f"{n} ({len(placement.plans[n].bundles)} x {_fmt(placement.plans[n].bundles[0])}, "
                            f"{placement.plans[n].strategy})" for n in pending)
        nodes = describe_nodes(*cluster_nodes())
        if time.monotonic() >= deadline:
            from grpo_dist.cluster.ray_utils import ClusterError

            placement.remove()
            raise ClusterError(f"cluster: placement groups {waiting} not placed within "
                                 f"cluster.placement_timeout_s={cfg.cluster.placement_timeout_s:g} s ({nodes})")
        log.warning("waiting for placement groups %s; %s", waiting, nodes)
    return placement
