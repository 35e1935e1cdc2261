"""Ray actor wrappers around the plain worker classes, and the construction of the three groups.

Every actor runs in a bundle of its role's placement group (``placement.py``). Learner
rendezvous: all ranks are created (rank i in bundle i), rank 0 reports its node's IP and a port
that is free *on that node*, then every rank joins the process group at that address.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any, Callable, Optional

import ray

from grpo_dist.cluster.placement import Placement, actor_specs, place
from grpo_dist.cluster.ports import free_port
from grpo_dist.cluster.ray_utils import ActorGroup
from grpo_dist.config import Config
from grpo_dist.devices import torch_threads
from grpo_dist.learner import Learner
from grpo_dist.reward.worker import RewardWorker
from grpo_dist.rollout.stream_worker import StreamingRolloutWorker
from grpo_dist.rollout.worker import RolloutWorker

log = logging.getLogger("grpo_dist.cluster")


class _Placed:
    """Mixin: where an actor runs (for learner rendezvous, placement checks and logs)."""

    def node_info(self) -> dict:
        return {"ip": ray.util.get_node_ip_address(), "pid": os.getpid(),
                "node_id": ray.get_runtime_context().get_node_id(), "gpu_ids": [str(g) for g in ray.get_gpu_ids()]}

    def debug_call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """The one test and fault-injection hook: run ``fn(worker, *args, **kwargs)`` inside this
        actor on its plain worker object and return the result. Training never calls it; the
        functions tests pass live in ``grpo_dist.learner.testing`` (``loss_inputs``, ``set_lr``)
        and ``grpo_dist.rollout.testing`` (``hang_next_generate``)."""
        return fn(self, *args, **kwargs)


class RolloutActor(_Placed, RolloutWorker):
    pass


class StreamingRolloutActor(_Placed, StreamingRolloutWorker):
    """An async actor (``rollout.streaming``): one engine, many groups in flight."""


class RewardActor(_Placed, RewardWorker):
    pass


class LearnerActor(_Placed, Learner):
    def rendezvous_address(self) -> dict:
        """This node's IP and a port free on it (called on rank 0 only)."""
        ip = ray.util.get_node_ip_address()
        return {"ip": ip, "port": free_port(ip)}

    def setup(self, master_addr: Optional[str] = None, master_port: Optional[int] = None,
              peers_on_node: int = 1) -> dict:
        import torch

        if master_addr is not None:
            self.master_addr, self.master_port = master_addr, int(master_port)
        # the Learner leaves process-wide thread settings alone; inside an actor we own the process
        threads, why = torch_threads(self.cfg, "learner", peers_on_node)
        torch.set_num_threads(threads)
        if self.rank == 0:
            print(f"learner torch threads: {threads} ({why})", flush=True)
        return {**super().setup(), "torch_threads": threads}


@dataclass
class Workers:
    rollout: ActorGroup
    reward: ActorGroup
    learner: ActorGroup
    placement: Optional[Placement] = None

    def all_groups(self) -> list[ActorGroup]:
        return [self.rollout, self.reward, self.learner]

    def kill(self) -> None:
        for g in self.all_groups():
            g.kill()
        if self.placement is not None:
            self.placement.remove()


def create_generators(cfg: Config, placement: Optional[Placement] = None) -> tuple[ActorGroup, ActorGroup]:
    """The rollout and reward actor groups (created, not yet set up)."""
    spec = actor_specs(cfg)
    streaming = cfg.rollout.streaming  # an async actor: its calls run concurrently
    rollout = ActorGroup.create("rollout", StreamingRolloutActor if streaming else RolloutActor,
                                [(cfg, i) for i in range(cfg.rollout.num_workers)], spec=spec["rollout"],
                                placement=placement, max_concurrency=1000 if streaming else 1)
    return rollout, create_reward(cfg, placement)


def create_reward(cfg: Config, placement: Optional[Placement] = None) -> ActorGroup:
    """The reward actor group. Streaming: a group's scoring starts when its generation is done,
    whatever was submitted before it (out-of-order execution)."""
    return ActorGroup.create("reward", RewardActor, [(cfg.reward,)] * cfg.reward.num_workers,
                             spec=actor_specs(cfg)["reward"], placement=placement,
                             out_of_order=cfg.rollout.streaming)


def start_learners(cfg: Config, placement: Optional[Placement]) -> tuple[ActorGroup, list]:
    """Create every learner rank in its bundle, ask rank 0 where to meet, start ``setup`` on all
    ranks (returns the group and the setup refs)."""
    c, k = cfg.cluster, cfg.learner.num_learners
    learner = ActorGroup.create("learner", LearnerActor, [(cfg, r, k) for r in range(k)],
                                spec=actor_specs(cfg)["learner"], placement=placement, timeout=c.learner_timeout_s)
    where = learner.get([learner.actors[0].rendezvous_address.remote()], timeout=c.actor_start_timeout_s,
                        ranks=[0])[0]
    log.info("learner rendezvous at %s:%s (rank 0's node)", where["ip"], where["port"])
    peers = [n for _, n in on_nodes(learner, c.actor_start_timeout_s)[0]]
    return learner, learner.call_each("setup", [(where["ip"], where["port"], n) for n in peers])


def on_nodes(group: ActorGroup, timeout: float) -> tuple[list[tuple[int, int]], list[str]]:
    """For each actor of ``group``: (its index among the group's actors on its node, how many
    share that node); and each actor's node id."""
    nodes = [n["node_id"] for n in group.get(group.call("node_info"), timeout=timeout)]
    return [(nodes[:i].count(n), nodes.count(n)) for i, n in enumerate(nodes)], nodes


def start_workers(cfg: Config) -> tuple[Workers, dict]:
    """Place the groups, create every actor, then set them all up concurrently (engines load
    while learners init)."""
    placement = place(cfg)
    t = cfg.cluster.actor_start_timeout_s
    try:
        rollout, reward = create_generators(cfg, placement)
        learner, l_refs = start_learners(cfg, placement)
        workers = Workers(rollout, reward, learner, placement)
        engines, nodes = on_nodes(rollout, t)
        learner_nodes = on_nodes(learner, t)[1]
        r_refs = rollout.call_each("setup", [(n, i, learner_nodes.count(node))
                                             for (i, n), node in zip(engines, nodes)])
        w_refs = reward.call("names")
        info = {"rollout": rollout.get(r_refs, timeout=t), "learner": learner.get(l_refs, timeout=t),
                "reward": reward.get(w_refs, timeout=t)}
    except BaseException:
        placement.remove()
        raise
    return workers, info
