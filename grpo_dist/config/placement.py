"""The placement plan (pure: no Ray): one group per role, bundles from the config, checked per node.

The Ray side (creating the groups, the bounded wait) is ``grpo_dist.cluster.placement``.

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

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Optional

from grpo_dist.config.sections import ConfigError

if TYPE_CHECKING:
    from grpo_dist.config.root import Config

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


def actor_specs(cfg: "Config") -> dict[str, ActorSpec]:
    c = cfg.cluster
    return {"learner": ActorSpec(c.learner_cpus, c.learner_gpus, dict(c.learner_resources)),
            "rollout": ActorSpec(c.rollout_cpus, c.rollout_gpus, dict(c.rollout_resources)),
            "reward": ActorSpec(c.reward_cpus, 0.0, dict(c.reward_resources))}


def _add(a: dict[str, float], b: dict[str, float]) -> dict[str, float]:
    out = dict(a)
    for k, v in b.items():
        out[k] = out.get(k, 0.0) + v
    return out


def plan(cfg: "Config") -> list[GroupPlan]:
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


def fmt_resources(res: dict[str, float]) -> str:
    keep = {k: v for k, v in res.items() if not k.startswith("node:") and not k.endswith("memory")
            and k != "accelerator_type" and not k.startswith("accelerator_type:")}
    return "{" + ", ".join(f"{k}: {v:g}" for k, v in sorted(keep.items())) + "}"


def describe_nodes(totals: dict[str, dict[str, float]], free: Optional[dict[str, dict[str, float]]] = None) -> str:
    free = free or {}
    return "; ".join(f"node {nid[:8]} free {fmt_resources(free.get(nid, tot))} of {fmt_resources(tot)}" for nid, tot in totals.items())


def check_feasible(groups: list[GroupPlan], totals: dict[str, dict[str, float]],
                   free: Optional[dict[str, dict[str, float]]] = None) -> None:
    """Raise :class:`PlacementError` if no packing of ``groups`` onto nodes with ``totals`` exists
    (conservative: only requests that are certainly impossible fail; a feasible-looking one that
    a smarter packing would need is left to Ray and the bounded wait)."""
    nodes = describe_nodes(totals, free)
    for g in groups:
        for i, b in enumerate(g.bundles):
            if not any(_fits(b, t) for t in totals.values()):
                raise PlacementError(f"cluster: bundle {i} of the {g.name} group {fmt_resources(b)} fits on no node "
                                     f"({nodes})")
        if g.strategy == "STRICT_PACK":
            need = {}
            for b in g.bundles:
                need = _add(need, b)
            if not any(_fits(need, t) for t in totals.values()):
                raise PlacementError(f"cluster: the {g.name} group ({len(g.bundles)} x {fmt_resources(g.bundles[0])}, "
                                     f"STRICT_PACK) fits on no single node ({nodes})")
        if g.strategy == "STRICT_SPREAD":
            capable = sum(1 for t in totals.values() if _fits(g.bundles[0], t)) if g.bundles else 0
            if capable < len(g.bundles):
                raise PlacementError(f"cluster: the {g.name} group (STRICT_SPREAD) needs {len(g.bundles)} nodes "
                                     f"that each hold {fmt_resources(g.bundles[0])}, the cluster has {capable} ({nodes})")
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
