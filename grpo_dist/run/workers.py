"""The run's three actor groups (rollout, reward, learner): created in their placement groups, set up.

Every actor runs in a bundle of its role's placement group (``cluster/placement.py``). Learner
rendezvous: all ranks are created (rank i in bundle i), rank 0 reports its node's IP and a port
that is free *on that node*, then every rank joins the process group at that address.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Optional

from grpo_dist.cluster.actors import Placed, on_nodes
from grpo_dist.cluster.placement import Placement, actor_specs, place
from grpo_dist.cluster.ray_utils import ActorGroup
from grpo_dist.config import Config
from grpo_dist.devices import torch_threads
from grpo_dist.learner import Learner
from grpo_dist.rollout.stream_worker import StreamingRolloutWorker
from grpo_dist.rollout.worker import RolloutWorker
from grpo_dist.run.reward_actor import RewardActor

log = logging.getLogger("grpo_dist.cluster")


class RolloutActor(Placed, RolloutWorker):
    pass


class StreamingRolloutActor(Placed, StreamingRolloutWorker):
    """An async actor (``rollout.streaming``): one engine, many groups in flight."""


class LearnerActor(Placed, Learner):
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

    def hosts(self, timeout: float = 60) -> dict[str, list[str]]:
        """Each role's node addresses, one per actor (rank order), and the driver's: where the run
        ran at its end (replaced actors included)."""
        import ray

        out = {"driver": [ray.util.get_node_ip_address()]}
        for name, group in (("learner", self.learner), ("rollout", self.rollout), ("reward", self.reward)):
            try:
                out[name] = [i["ip"] for i in group.get(group.call("node_info"), timeout=timeout)]
            except Exception as e:  # a report, never a reason to fail a finished run
                log.warning("nodes of the %s actors not read: %s", name, e)
        return out

    def peak_rss_gib(self, timeout: float = 60) -> dict[str, float]:
        """Each role's peak resident set over the run so far, GiB: the largest actor of the role,
        its child processes included (a vLLM engine's core and workers), and the driver's."""
        from grpo_dist.util.memory import peak_rss

        out = {}
        for name, group in (("learner", self.learner), ("rollout", self.rollout), ("reward", self.reward)):
            try:
                peaks = group.get(group.call("peak_rss"), timeout=timeout)
            except Exception as e:  # a report, never a reason to fail a finished run
                log.warning("peak RSS of the %s actors not read: %s", name, e)
                continue
            out[name] = max(p["self"] + p["children"] for p in peaks) / 2**30
        out["driver"] = peak_rss(children=False)["self"] / 2**30
        return out

    def close(self, quick: bool = False) -> None:
        """The engines release their processes and adapter dirs (5 s each when ``quick``: a stop was
        requested), then every actor and the placement go."""
        try:
            self.rollout.get(self.rollout.call("close"), timeout=5 if quick else 60)
        except Exception:  # pragma: no cover - shutting down anyway
            pass
        self.kill()

    def kill(self) -> None:
        for g in self.all_groups():
            g.kill()
        if self.placement is not None:
            self.placement.remove()


def heartbeat(cfg: Config) -> tuple[float, float]:
    """(interval, timeout) of the heartbeat the driver polls while it waits on an actor."""
    return cfg.cluster.heartbeat_interval_s, cfg.cluster.heartbeat_timeout_s


def create_generators(cfg: Config, placement: Optional[Placement] = None,
                      adapters: Optional[dict[str, Config]] = None) -> tuple[ActorGroup, ActorGroup]:
    """The rollout and reward actor groups (created, not yet set up); ``adapters``: several
    adapters' configs (``run/fleet.py``), which every actor holds."""
    spec = actor_specs(cfg)
    streaming = cfg.rollout.streaming  # an async actor: its calls run concurrently
    rollout = ActorGroup.create("rollout", StreamingRolloutActor if streaming else RolloutActor,
                                [(cfg, i) + ((adapters,) if adapters else ()) for i in range(cfg.rollout.num_workers)],
                                spec=spec["rollout"], placement=placement, max_concurrency=1000 if streaming else 1,
                                heartbeat=heartbeat(cfg))
    return rollout, create_reward(cfg, placement, adapters)


def create_reward(cfg: Config, placement: Optional[Placement] = None,
                  adapters: Optional[dict[str, Config]] = None) -> ActorGroup:
    """The reward actor group. Streaming: a group's scoring starts when its generation is done,
    whatever was submitted before it (out-of-order execution)."""
    args = (cfg.reward,) + (({n: a.reward for n, a in adapters.items()},) if adapters else ())
    return ActorGroup.create("reward", RewardActor, [args] * cfg.reward.num_workers,
                             spec=actor_specs(cfg)["reward"], placement=placement,
                             out_of_order=cfg.rollout.streaming, heartbeat=heartbeat(cfg))


def start_learners(cfg: Config, placement: Optional[Placement],
                   adapters: Optional[dict[str, Config]] = None) -> tuple[ActorGroup, list]:
    """Create every learner rank in its bundle, ask rank 0 where to meet, start ``setup`` on all
    ranks (returns the group and the setup refs)."""
    c, k = cfg.cluster, cfg.learner.num_learners
    more = ("127.0.0.1", 29500, None, adapters) if adapters else ()  # (the address: set by setup below)
    learner = ActorGroup.create("learner", LearnerActor, [(cfg, r, k) + more for r in range(k)],
                                spec=actor_specs(cfg)["learner"], placement=placement, timeout=c.learner_timeout_s,
                                heartbeat=heartbeat(cfg))
    where = learner.get([learner.actors[0].rendezvous_address.remote()], timeout=c.actor_start_timeout_s,
                        ranks=[0])[0]
    log.info("learner rendezvous at %s:%s (rank 0's node)", where["ip"], where["port"])
    peers = [n for _, n in on_nodes(learner, c.actor_start_timeout_s)[0]]
    return learner, learner.call_each("setup", [(where["ip"], where["port"], n) for n in peers])


def start_workers(cfg: Config, adapters: Optional[dict[str, Config]] = None) -> tuple[Workers, dict]:
    """Place the groups, create every actor, then set them all up concurrently (engines load
    while learners init). ``adapters``: several adapters on these actors (``run/fleet.py``)."""
    placement = place(cfg)
    t = cfg.cluster.actor_start_timeout_s
    try:
        rollout, reward = create_generators(cfg, placement, adapters)
        learner, l_refs = start_learners(cfg, placement, adapters)
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


def startup_times(info: dict, total_s: float) -> tuple[dict[str, float], str]:
    """Where the actors' start-up went, from ``start_workers``' ``info``: the slowest engine's start
    (vLLM: load, compile, CUDA graphs, KV cache), the slowest learner rank's set-up (process group,
    model, DeepSpeed), and the rest (placement, Ray starting the actors' processes, their imports),
    which the set-ups overlap. Returns ``startup/*`` seconds and the line the run prints."""
    engine = max((float(r.get("startup_s", 0.0)) for r in info.get("rollout", [])), default=0.0)
    learners = info.get("learner", [])
    learner = max((float(r.get("timing/setup", 0.0)) for r in learners), default=0.0)
    dist = max((float(r.get("timing/init_distributed", 0.0)) for r in learners), default=0.0)
    times = {"startup/actors_s": total_s, "startup/engine_s": engine, "startup/learner_s": learner,
             "startup/learner_process_group_s": dist, "startup/other_s": max(0.0, total_s - max(engine, learner))}
    line = (f"actors ready in {total_s:.0f} s: engine start {engine:.0f} s (slowest of {len(info.get('rollout', []))}), "
            f"learner set-up {learner:.0f} s (process group {dist:.0f} s), "
            f"before them {times['startup/other_s']:.0f} s (placement, actor processes, imports)")
    return times, line
