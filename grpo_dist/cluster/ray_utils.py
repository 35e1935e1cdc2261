"""Ray glue: start or join a cluster, run actor groups (placement: ``placement.py``).

The workers themselves (RolloutWorker, RewardWorker, Learner) are plain classes; this module is
the only place that knows about ``ray.remote``.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Optional, Sequence

import ray
from ray.exceptions import RayActorError, RayError, RayTaskError

from grpo_dist.config import Config
from grpo_dist.util.procenv import setup_env

if TYPE_CHECKING:
    from grpo_dist.cluster.placement import ActorSpec, Placement

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
        # address="local": always a fresh cluster, never one a `ray start` left on this machine;
        # token authentication on, with a token of this run's own (local_auth.py)
        from grpo_dist.cluster import local_auth

        env.update(local_auth.enable())
        ray.init(address="local", num_cpus=cfg.cluster.num_cpus, include_dashboard=False, runtime_env=runtime_env,
                 log_to_driver=True, configure_logging=True, logging_level=logging.WARNING)
        from grpo_dist.cluster.reaper import start_reaper

        start_reaper()  # a driver killed with SIGKILL leaves no process of this cluster behind
    from grpo_dist.cluster.worker_logs import route

    route(None if cfg.logging.verbose else worker_log_path(cfg))  # quiet: the actors' output in a file
    return ray.cluster_resources()


def worker_log_path(cfg: Config):
    from pathlib import Path

    return Path(cfg.output_dir) / "workers.log"


def alive_nodes() -> int:
    return sum(1 for n in ray.nodes() if n.get("Alive"))


@dataclass
class ActorGroup:
    """N actors of one role; every call names the role and rank of a failed actor."""

    role: str
    actors: list[Any]
    factory: Optional[Callable[[int], Any]] = field(default=None, repr=False)  # a fresh actor for rank i

    timeout: Optional[float] = None  # default timeout of ``get`` (None = wait forever)

    @classmethod
    def create(cls, role: str, worker_cls: type, args_per_rank: Sequence[tuple], *, spec: "ActorSpec",
               placement: Optional["Placement"] = None, max_concurrency: int = 1,
               timeout: Optional[float] = None, out_of_order: bool = False) -> "ActorGroup":
        """``args_per_rank[i]``: constructor arguments of rank i, placed in bundle i of the role's
        placement group (when ``placement`` is given). ``out_of_order``: a call runs as soon as its
        arguments are ready, not after every call submitted before it (still one at a time)."""
        remote_cls = ray.remote(worker_cls)
        args_per_rank = list(args_per_rank)

        def factory(rank: int):
            opts: dict[str, Any] = dict(num_cpus=spec.num_cpus, num_gpus=spec.num_gpus, max_concurrency=max_concurrency)
            if out_of_order:
                opts["allow_out_of_order_execution"] = True
            if spec.resources:
                opts["resources"] = dict(spec.resources)
            if placement is not None:
                opts["scheduling_strategy"] = placement.strategy(role, rank)
            return remote_cls.options(**opts).remote(*args_per_rank[rank])

        return cls(role, [factory(i) for i in range(len(args_per_rank))], factory, timeout)

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
        """``ray.get`` that turns a dead, failing or silent actor into one clear ClusterError.

        Fails as soon as any ref fails (a dead rank is reported at once, not after the ranks that
        wait for it in a collective time out). ``timeout``: seconds for all refs (default: the
        group's). ``ranks``: the actor rank of each ref (default: one ref per actor, in order)."""
        timeout = self.timeout if timeout is None else timeout
        deadline = None if timeout is None else time.monotonic() + timeout
        pending = list(refs)
        while pending:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            ready, pending = ray.wait(pending, num_returns=1, timeout=left)
            if not ready:
                rank = _first_unfinished(refs, self.actors, ranks)
                raise ClusterError(f"{self.role} worker {_name(rank)}: no answer within {timeout:g} s (hung, or "
                                   f"resources the cluster cannot provide)", self.role, rank, hung=True)
            try:
                ray.get(ready)
            except RayActorError as e:
                rank = _rank_of(ready[0], refs, self.actors, ranks)
                raise ClusterError(f"{self.role} worker {_name(rank)} died: {e.__class__.__name__}: "
                                   f"{str(e).splitlines()[0] if str(e) else ''}", self.role, rank, dead=True) from e
            except RayTaskError as e:
                rank = _rank_of(ready[0], refs, self.actors, ranks)
                cause = e.cause if getattr(e, "cause", None) is not None else e
                raise ClusterError(f"{self.role} worker {_name(rank)} failed: {cause.__class__.__name__}: {cause}",
                                   self.role, rank) from e
            except RayError as e:  # e.g. an argument's object lost with its node: not this actor's fault
                rank = _rank_of(ready[0], refs, self.actors, ranks)
                raise ClusterError(f"{self.role} worker {_name(rank)}: {e.__class__.__name__}: "
                                   f"{str(e).splitlines()[0] if str(e) else ''}", self.role, rank) from e
        return ray.get(list(refs))

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


def _rank_of(ref: Any, refs: list[Any], actors: list[Any], ranks: Optional[Sequence[int]] = None) -> Optional[int]:
    return next((rank for rank, r in zip(_ranks_of(refs, actors, ranks), refs) if r.hex() == ref.hex()), None)


def _first_unfinished(refs: list[Any], actors: list[Any], ranks: Optional[Sequence[int]] = None) -> Optional[int]:
    """The rank of the first ref that has not finished."""
    _, waiting = ray.wait(list(refs), num_returns=len(refs), timeout=0)
    waiting_ids = {r.hex() for r in waiting}
    return next((rank for rank, r in zip(_ranks_of(refs, actors, ranks), refs) if r.hex() in waiting_ids), None)


def _name(rank: Optional[int]) -> str:
    return "?" if rank is None else str(rank)


def shutdown_ray() -> None:
    from grpo_dist.cluster.worker_logs import unroute

    unroute()
    if ray.is_initialized():
        ray.shutdown()
    from grpo_dist.cluster import local_auth

    local_auth.restore()
