"""Ray glue: start or join a cluster, check resources before any actor starts, run actor groups.

The workers themselves (RolloutWorker, RewardWorker, Learner) are plain classes; this module is
the only place that knows about ``ray.remote``.
"""

from __future__ import annotations

import logging
import os
import socket
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence

import ray
from ray.exceptions import GetTimeoutError, RayActorError, RayTaskError

from grpo_dist.config import Config
from grpo_dist.env import setup_env

log = logging.getLogger("grpo_dist.cluster")


class ClusterError(RuntimeError):
    """A worker died, failed or could not be placed; the message names which.

    ``role`` / ``rank`` name the worker when known; ``dead`` is True when its process is gone and
    ``hung`` when it did not answer in time (a replacement may take over its work in both cases);
    both False when it raised (a bug: retrying would repeat it).
    """

    def __init__(self, msg: str, role: Optional[str] = None, rank: Optional[int] = None, dead: bool = False,
                 hung: bool = False):
        super().__init__(msg)
        self.role, self.rank, self.dead, self.hung = role, rank, dead, hung


def init_ray(cfg: Config) -> dict[str, Any]:
    """Join ``cluster.address`` (or the job's cluster) or start a local one on loopback."""
    env = setup_env()
    if ray.is_initialized():
        return ray.cluster_resources()
    runtime_env = {"env_vars": env}
    if cfg.cluster.address:
        # Inside `ray job submit` the job already has a runtime_env (working_dir, env_vars): combine
        # ours with it instead of failing on the overlap (ours wins on equal keys).
        os.environ.setdefault("RAY_OVERRIDE_JOB_RUNTIME_ENV", "1")
        ray.init(address=cfg.cluster.address, runtime_env=runtime_env, log_to_driver=True)
    else:
        # address="local": always a fresh cluster, never one a `ray start` left on this machine
        ray.init(address="local", num_cpus=cfg.cluster.num_cpus, include_dashboard=False, runtime_env=runtime_env,
                 log_to_driver=True, configure_logging=True, logging_level=logging.WARNING)
    return ray.cluster_resources()


def check_resources(cfg: Config) -> None:
    """Fail now, not after a hang: an actor asking for more than the cluster has never starts."""
    have = ray.cluster_resources()
    need = cfg.resource_demand()
    for res, amount in need.items():
        if amount > have.get(res, 0.0) + 1e-9:
            raise ClusterError(
                f"cluster: actors need {amount:g} {res} but the cluster has {have.get(res, 0.0):g} "
                f"(rollout {cfg.rollout.num_workers} x {cfg.cluster.rollout_cpus} CPU / {cfg.cluster.rollout_gpus} GPU, "
                f"reward {cfg.reward.num_workers} x {cfg.cluster.reward_cpus} CPU, "
                f"learner {cfg.learner.num_learners} x {cfg.cluster.learner_cpus} CPU / {cfg.cluster.learner_gpus} GPU)")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class ActorGroup:
    """N actors of one role; every call names the role and rank of a failed actor."""

    role: str
    actors: list[Any]
    factory: Optional[Callable[[int], Any]] = field(default=None, repr=False)  # a fresh actor for rank i

    @classmethod
    def create(cls, role: str, worker_cls: type, args_per_rank: Sequence[tuple], *, num_cpus: float,
               num_gpus: float = 0.0, max_concurrency: int = 1) -> "ActorGroup":
        remote_cls = ray.remote(worker_cls)
        args_per_rank = list(args_per_rank)

        def factory(rank: int):
            return remote_cls.options(num_cpus=num_cpus, num_gpus=num_gpus, name=None,
                                      max_concurrency=max_concurrency).remote(*args_per_rank[rank])

        return cls(role, [factory(i) for i in range(len(args_per_rank))], factory)

    def replace(self, rank: int) -> Any:
        """Kill rank ``rank`` (if anything is left of it) and start a fresh actor in its place
        (constructed, not set up)."""
        try:
            ray.kill(self.actors[rank])
        except Exception:  # already gone
            pass
        self.actors[rank] = self.factory(rank)
        return self.actors[rank]

    def __len__(self) -> int:
        return len(self.actors)

    def call(self, method: str, *args, **kwargs) -> list[Any]:
        """Same call on every actor; returns ObjectRefs."""
        return [getattr(a, method).remote(*args, **kwargs) for a in self.actors]

    def call_each(self, method: str, per_rank_args: Sequence[tuple]) -> list[Any]:
        return [getattr(a, method).remote(*args) for a, args in zip(self.actors, per_rank_args)]

    def get(self, refs: list[Any], timeout: float | None = None, ranks: Optional[Sequence[int]] = None) -> list[Any]:
        """``ray.get`` that turns a dead or failing actor into one clear ClusterError.

        ``ranks``: the actor rank of each ref (default: ``refs`` has one ref per actor, in order)."""
        try:
            return ray.get(refs, timeout=timeout)
        except GetTimeoutError as e:
            rank = _first_unfinished(refs, self.actors, ranks)
            raise ClusterError(f"{self.role} worker {_name(rank)}: no answer within {timeout:g} s (hung, or "
                               f"resources the cluster cannot provide)", self.role, rank, hung=True) from e
        except RayActorError as e:
            rank = _which(refs, self.actors, ranks)
            raise ClusterError(f"{self.role} worker {_name(rank)} died: {e.__class__.__name__}: "
                               f"{str(e).splitlines()[0] if str(e) else ''}", self.role, rank, dead=True) from e
        except RayTaskError as e:
            rank = _which(refs, self.actors, ranks)
            cause = e.cause if getattr(e, "cause", None) is not None else e
            raise ClusterError(f"{self.role} worker {_name(rank)} failed: {cause.__class__.__name__}: {cause}",
                               self.role, rank) from e

    def kill(self) -> None:
        for a in self.actors:
            try:
                ray.kill(a)
            except Exception:  # pragma: no cover - already gone
                pass
        self.actors = []


def _ranks_of(refs: list[Any], actors: list[Any], ranks: Optional[Sequence[int]]) -> Sequence[Optional[int]]:
    """The actor rank of each ref: as given, or refs in rank order when there is one per actor."""
    if ranks is not None:
        return ranks
    return range(len(refs)) if len(refs) == len(actors) else [None] * len(refs)


def _which(refs: list[Any], actors: list[Any], ranks: Optional[Sequence[int]] = None) -> Optional[int]:
    """Best effort: the rank of the first ref that failed."""
    for rank, r in zip(_ranks_of(refs, actors, ranks), refs):
        try:
            ray.get(r, timeout=0)
        except GetTimeoutError:
            continue
        except Exception:
            return rank
    return None


def _first_unfinished(refs: list[Any], actors: list[Any], ranks: Optional[Sequence[int]] = None) -> Optional[int]:
    """The rank of the first ref that has not finished."""
    _, waiting = ray.wait(list(refs), num_returns=len(refs), timeout=0)
    waiting_ids = {r.hex() for r in waiting}
    return next((rank for rank, r in zip(_ranks_of(refs, actors, ranks), refs) if r.hex() in waiting_ids), None)


def _name(rank: Optional[int]) -> str:
    return "?" if rank is None else str(rank)


def shutdown_ray() -> None:
    if ray.is_initialized():
        ray.shutdown()
