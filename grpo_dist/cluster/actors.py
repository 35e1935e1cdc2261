"""Ray actor wrappers around the plain worker classes, and the construction of the three groups."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Callable

import ray

from grpo_dist.cluster.ray_utils import ActorGroup, free_port
from grpo_dist.config import Config
from grpo_dist.learner import Learner
from grpo_dist.reward.worker import RewardWorker
from grpo_dist.rollout.worker import RolloutWorker


class _Placed:
    """Mixin: where an actor runs (node IP and process id, for logs and tests)."""

    def node_info(self) -> dict:
        return {"ip": ray.util.get_node_ip_address(), "pid": os.getpid()}

    def debug_call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """The one test and fault-injection hook: run ``fn(worker, *args, **kwargs)`` inside this
        actor on its plain worker object and return the result. Training never calls it; the
        functions tests pass live in ``grpo_dist.learner.testing`` (``loss_inputs``, ``set_lr``)
        and ``grpo_dist.rollout.testing`` (``hang_next_generate``)."""
        return fn(self, *args, **kwargs)


class RolloutActor(_Placed, RolloutWorker):
    pass


class RewardActor(_Placed, RewardWorker):
    pass


class LearnerActor(_Placed, Learner):
    def setup(self) -> dict:
        import torch

        # the Learner leaves process-wide thread settings alone; inside an actor we own the process
        torch.set_num_threads(self.cfg.cluster.torch_threads)
        return super().setup()

    def rendezvous_address(self) -> dict:
        """This node's IP and a port free on it, for the DeepSpeed group's rendezvous (rank 0)."""
        return {"ip": ray.util.get_node_ip_address(), "port": free_port()}


@dataclass
class Workers:
    rollout: ActorGroup
    reward: ActorGroup
    learner: ActorGroup

    def all_groups(self) -> list[ActorGroup]:
        return [self.rollout, self.reward, self.learner]

    def kill(self) -> None:
        for g in self.all_groups():
            g.kill()


def create_generators(cfg: Config) -> tuple[ActorGroup, ActorGroup]:
    """The rollout and reward actor groups (created, not yet set up)."""
    c = cfg.cluster
    rollout = ActorGroup.create("rollout", RolloutActor, [(cfg, i) for i in range(cfg.rollout.num_workers)],
                                num_cpus=c.rollout_cpus, num_gpus=c.rollout_gpus)
    reward = ActorGroup.create("reward", RewardActor, [(cfg.reward,)] * cfg.reward.num_workers,
                               num_cpus=c.reward_cpus)
    return rollout, reward


def start_workers(cfg: Config) -> tuple[Workers, dict]:
    """Create every actor, then set them all up concurrently (engines load while learners init)."""
    c = cfg.cluster
    rollout, reward = create_generators(cfg)
    k = cfg.learner.num_learners
    first = ActorGroup.create("learner", LearnerActor, [(cfg, 0, k, "127.0.0.1", 0)],
                              num_cpus=c.learner_cpus, num_gpus=c.learner_gpus)
    where = first.get([first.actors[0].rendezvous_address.remote()], timeout=c.actor_start_timeout_s)[0]
    addr, port = (where["ip"], where["port"]) if k > 1 else ("127.0.0.1", where["port"])
    first.kill()
    learner = ActorGroup.create("learner", LearnerActor, [(cfg, r, k, addr, port) for r in range(k)],
                                num_cpus=c.learner_cpus, num_gpus=c.learner_gpus)
    t = c.actor_start_timeout_s
    r_refs, l_refs, w_refs = rollout.call("setup"), learner.call("setup"), reward.call("names")
    info = {"rollout": rollout.get(r_refs, timeout=t), "learner": learner.get(l_refs, timeout=t),
            "reward": reward.get(w_refs, timeout=t)}
    return Workers(rollout, reward, learner), info
