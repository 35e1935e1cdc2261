"""Ray glue: start or join a cluster, run actor groups (placement: ``placement.py``).

The workers themselves (RolloutWorker, RewardWorker, Learner) are plain classes; this module is
the only place an actor class becomes a Ray actor (``ray.remote``). The other ``ray.remote`` uses
are small tasks: node probes (``node_loss.py``, ``shared_dir.py``) and ``grpo-dist doctor``'s check.
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
from grpo_dist.util.proc_health import describe
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
                 hung: bool = False, interrupted: bool = False):
        super().__init__(msg)
        self.role, self.rank, self.dead, self.hung = role, rank, dead, hung
        self.interrupted = interrupted  # found while a stop was requested (Ctrl-C): stop, do not replace


POLL_S = 5.0  # longest single wait of ``ActorGroup.get``: a signal handler (Ctrl-C) runs between waits
PEER_PROBE_S = 5.0  # after one rank raised: how long the others get to answer a heartbeat (no heartbeat_timeout_s)
STOP_GRACE_S = 10.0  # after a stop request, a heartbeat silent this long stops the wait
_stop_requested_at: list[Optional[float]] = [None]


def request_stop(on: bool = True) -> None:
    """A stop was requested (the first Ctrl-C): from now on ``ActorGroup.get`` gives up on an
    actor whose heartbeat is silent for STOP_GRACE_S, or whose engine process is stopped or gone,
    with a ClusterError marked ``interrupted`` (the run then stops without replacing it).
    ``on=False`` clears it."""
    _stop_requested_at[0] = time.monotonic() if on else None


def stop_requested_at() -> Optional[float]:
    """When a stop was requested (``time.monotonic()``), or None: the waits that may outlast
    POLL_S (``node_loss``, the weight group's drain) give up on it."""
    return _stop_requested_at[0]


def init_ray(cfg: Config) -> dict[str, Any]:
    """Join ``cluster.address`` (or the job's cluster) or start a local one on loopback."""
    env = setup_env()
    if ray.is_initialized():
        return ray.cluster_resources()
    from grpo_dist.cluster.local_auth import SCRUB_HOOK

    # each worker drops the cluster token once connected: what it starts does not inherit it
    runtime_env = {"env_vars": env, "worker_process_setup_hook": SCRUB_HOOK}
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
                 log_to_driver=True, configure_logging=True, logging_level=logging.WARNING,
                 _temp_dir=local_auth.private_temp_dir())  # its sockets and logs: this user's only
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
    heartbeat_s: Optional[float] = None  # while ``get`` waits, each awaited actor's heartbeat every so often
    heartbeat_timeout_s: Optional[float] = None  # ... an unanswered one past this: the actor is hung
    beating: list = field(default_factory=list, repr=False)  # actors that answered a heartbeat once (started)

    @classmethod
    def create(cls, role: str, worker_cls: type, args_per_rank: Sequence[tuple], *, spec: "ActorSpec",
               placement: Optional["Placement"] = None, max_concurrency: int = 1,
               timeout: Optional[float] = None, out_of_order: bool = False,
               heartbeat: Optional[tuple[float, float]] = None) -> "ActorGroup":
        """``args_per_rank[i]``: constructor arguments of rank i, placed in bundle i of the role's
        placement group (when ``placement`` is given). ``out_of_order``: a call runs as soon as its
        arguments are ready, not after every call submitted before it (still one at a time).
        ``heartbeat``: (interval, timeout) seconds of the heartbeat ``get`` polls while it waits
        (the class needs ``heartbeat``, as ``cluster.actors.Placed`` gives it)."""
        groups = getattr(worker_cls, "heartbeat", None) is not None
        remote_cls = ray.remote(concurrency_groups={"health": 1})(worker_cls) if groups else ray.remote(worker_cls)
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

        beat = heartbeat if groups and heartbeat is not None else (None, None)
        return cls(role, [factory(i) for i in range(len(args_per_rank))], factory, timeout, *beat)

    def replace(self, rank: int) -> Any:
        """Kill rank ``rank`` (if anything is left of it) and start a fresh actor in its place
        (constructed, not set up)."""
        if self.heartbeat_s:  # its engine processes first: a stopped one would outlive the actor
            try:
                ray.get(self.actors[rank].kill_engine.remote(), timeout=5)
            except Exception:  # the actor itself is stopped or gone
                pass
        self.beating = [a for a in self.beating if a is not self.actors[rank]]
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
        """``ray.get`` that turns a dead, failing, silent or stopped actor into one clear ClusterError.

        Fails as soon as any ref fails (a dead rank is reported at once, not after the ranks that
        wait for it in a collective time out). ``timeout``: seconds for all refs (default: the
        group's). ``ranks``: the actor rank of each ref (default: one ref per actor, in order).
        With a heartbeat (``heartbeat_s``), the actors still owing an answer are asked every
        ``heartbeat_s``: one silent past ``heartbeat_timeout_s``, or reporting an engine process
        stopped or gone, fails the wait (hung / dead) long before ``timeout``."""
        timeout = self.timeout if timeout is None else timeout
        deadline = None if timeout is None else time.monotonic() + timeout
        pending = list(refs)
        beats = _Heartbeats(self, refs, ranks) if self.heartbeat_s else None
        poll = min(POLL_S, self.heartbeat_s or POLL_S)
        checked = time.monotonic()
        while pending:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            ready, pending = ray.wait(pending, num_returns=1, timeout=poll if left is None else min(left, poll))
            if beats is not None and pending and (not ready or time.monotonic() - checked >= poll):
                checked = time.monotonic()  # also while other refs keep finishing (one engine of several hung)
                beats.check(pending)
            if not ready:
                if left is not None and left <= poll:
                    rank = _first_unfinished(refs, self.actors, ranks)
                    raise ClusterError(f"{self.role} worker {_name(rank)}: no answer within {timeout:g} s (hung, or "
                                       f"resources the cluster cannot provide)", self.role, rank, hung=True)
                continue
            try:
                ray.get(ready)
                if beats is not None:
                    beats.started(_rank_of(ready[0], refs, self.actors, ranks))
            except RayActorError as e:
                rank = _rank_of(ready[0], refs, self.actors, ranks)
                raise ClusterError(f"{self.role} worker {_name(rank)} died: {e.__class__.__name__}: "
                                   f"{str(e).splitlines()[0] if str(e) else ''}", self.role, rank, dead=True) from e
            except RayTaskError as e:
                rank = _rank_of(ready[0], refs, self.actors, ranks)
                cause = e.cause if getattr(e, "cause", None) is not None else e
                if beats is not None and rank is not None:
                    beats.after_error(rank, cause)  # raised because its engine process died: dead, not a bug
                    self._peer_down(rank, refs, ranks, cause, beats)  # raised because a peer of its collective is gone
                raise ClusterError(f"{self.role} worker {_name(rank)} failed: {cause.__class__.__name__}: {cause}",
                                   self.role, rank) from e
            except RayError as e:  # e.g. an argument's object lost with its node: not this actor's fault
                rank = _rank_of(ready[0], refs, self.actors, ranks)
                raise ClusterError(f"{self.role} worker {_name(rank)}: {e.__class__.__name__}: "
                                   f"{str(e).splitlines()[0] if str(e) else ''}", self.role, rank) from e
        return ray.get(list(refs))

    def _peer_down(self, rank: int, refs: list[Any], ranks: Optional[Sequence[int]], cause: BaseException,
                   beats: "_Heartbeats") -> None:
        """``rank`` raised: if another actor this wait covers is dead, its engine process gone, or
        silent past ``heartbeat_timeout_s``, raise that instead (ranks of a process group lose a
        peer with its node, and the survivors raise first with a connection error naming only an
        address). A peer that is busy but alive answers its heartbeat, however late within that
        bound, and is left alone, whatever its role: it is not replaced. Silence counts from the
        peer's oldest unanswered heartbeat; an actor still starting is not asked. After a stop
        request (Ctrl-C) a peer silent for STOP_GRACE_S stops the wait, as in ``_Heartbeats.check``."""
        others = sorted({k for k in _ranks_of(refs, self.actors, ranks) if k is not None and k != rank}
                        & set(range(len(self.actors))))
        failed = f"{self.role} worker {rank} failed on it: {cause.__class__.__name__}: {(str(cause).splitlines() or [''])[0][:200]}"
        limit = self.heartbeat_timeout_s or PEER_PROBE_S
        now = time.monotonic()
        probes = {}  # rank -> (heartbeat ref, silent since)
        for k in others:
            if any(a is self.actors[k] for a in self.beating):
                ref, since = beats.sent.get(k, (None, now))
                probes[k] = (ref if ref is not None else self.actors[k].heartbeat.remote(), since)
        while probes:
            done, _ = ray.wait([r for r, _ in probes.values()], num_returns=len(probes), timeout=min(1.0, POLL_S))
            done_ids = {r.hex() for r in done}
            for k, (ref, _) in list(probes.items()):
                if ref.hex() in done_ids:
                    del probes[k]
                    beats.sent.pop(k, None)
                    try:
                        beats._read(k, ref)  # dead, or an engine process gone: that is the news
                    except ClusterError as e:
                        raise ClusterError(f"{e} ({failed})", e.role, e.rank, dead=e.dead, hung=e.hung,
                                           interrupted=e.interrupted) from e
            now, stop_at = time.monotonic(), _stop_requested_at[0]
            for k, (_, since) in probes.items():
                silent = now - since
                if stop_at is not None and now - max(since, stop_at) >= STOP_GRACE_S:
                    raise ClusterError(f"{self.role} worker {k}: no heartbeat for {silent:.0f} s ({failed})",
                                       self.role, k, hung=True, interrupted=True)
                if silent >= limit:
                    raise ClusterError(f"{self.role} worker {k}: no heartbeat for {silent:.0f} s "
                                       f"(cluster.heartbeat_timeout_s {limit:g}; {failed})", self.role, k, hung=True)

    def kill(self) -> None:
        for a in self.actors:
            try:
                ray.kill(a)
            except Exception:  # pragma: no cover - already gone
                pass
        self.actors = []


class _Heartbeats:
    """The heartbeats of the actors one ``ActorGroup.get`` waits on (one outstanding per actor)."""

    def __init__(self, group: ActorGroup, refs: list[Any], ranks: Optional[Sequence[int]]):
        self.group, self.ranks = group, list(_ranks_of(refs, group.actors, ranks))
        self.refs = {r.hex(): rank for r, rank in zip(refs, self.ranks)}
        self.sent: dict[int, tuple[Any, float]] = {}  # rank -> (heartbeat ref, when sent)
        self.answered: dict[int, float] = {}  # rank -> when its last heartbeat was answered

    def check(self, pending: list[Any]) -> None:
        """Ask each actor owing a ref for a heartbeat; raise for one silent too long or unwell."""
        g, now = self.group, time.monotonic()
        stop_at = _stop_requested_at[0]
        for rank in sorted({self.refs.get(r.hex()) for r in pending} - {None}):
            if rank >= len(g.actors):
                continue
            ref, since = self.sent.get(rank, (None, now))
            if ref is None:
                if now - self.answered.get(rank, -1e9) >= g.heartbeat_s:
                    self.sent[rank] = (g.actors[rank].heartbeat.remote(), now)
                continue
            if ray.wait([ref], timeout=0)[0]:
                del self.sent[rank]
                self.answered[rank] = now
                self.started(rank)
                self._read(rank, ref)
                continue
            if not any(a is g.actors[rank] for a in g.beating):
                continue  # still starting (a new process, its imports): the call's own timeout bounds that
            silent = now - since
            if stop_at is not None and now - max(since, stop_at) >= STOP_GRACE_S:
                raise ClusterError(f"{g.role} worker {rank}: no heartbeat for {silent:.0f} s (its process is "
                                   f"stopped or hung)", g.role, rank, hung=True, interrupted=True)
            if silent >= g.heartbeat_timeout_s:
                raise ClusterError(f"{g.role} worker {rank}: no heartbeat for {silent:.0f} s "
                                   f"(cluster.heartbeat_timeout_s {g.heartbeat_timeout_s:g}; its process is stopped "
                                   f"or hung)", g.role, rank, hung=True)

    def started(self, rank: Optional[int]) -> None:
        """``rank`` answered (a heartbeat or a call): it is up, its silence counts from now on."""
        g = self.group
        if rank is not None and rank < len(g.actors) and not any(a is g.actors[rank] for a in g.beating):
            g.beating.append(g.actors[rank])

    def _read(self, rank: int, ref: Any) -> None:
        g = self.group
        try:
            beat = ray.get(ref)
        except RayError as e:  # the actor is gone: its own refs fail next
            raise ClusterError(f"{g.role} worker {rank} died: {e.__class__.__name__}", g.role, rank, dead=True) from e
        if beat.get("problems"):
            what = describe(beat["problems"])
            stopped = all(state == "stopped" for _, _, state in beat["problems"])
            raise ClusterError(f"{g.role} worker {rank}: engine process {what}", g.role, rank, dead=not stopped,
                               hung=stopped, interrupted=_stop_requested_at[0] is not None)
        stalled, stop_at = float(beat.get("stalled_s") or 0.0), _stop_requested_at[0]
        if stop_at is not None and stalled >= STOP_GRACE_S:  # after a stop request: as a silent heartbeat
            raise ClusterError(f"{g.role} worker {rank}: its engine call made no progress for {stalled:.0f} s (the "
                               f"engine is stuck)", g.role, rank, hung=True, interrupted=True)
        if g.heartbeat_timeout_s and stalled >= g.heartbeat_timeout_s:  # alive, but its engine does not move
            raise ClusterError(f"{g.role} worker {rank}: its engine call made no progress for {stalled:.0f} s "
                               f"(cluster.heartbeat_timeout_s {g.heartbeat_timeout_s:g}; the actor answers, the engine "
                               f"is stuck)", g.role, rank, hung=True)

    def after_error(self, rank: int, cause: BaseException) -> None:
        """A call of ``rank`` raised: if its engine process is gone or stopped (or vLLM says its
        engine is dead), raise that instead (the actor is replaced, not reported as a bug)."""
        g = self.group
        if cause.__class__.__name__ in ("EngineDeadError", "EngineProcessLost"):
            raise ClusterError(f"{g.role} worker {rank}: engine dead: {cause}", g.role, rank, dead=True)
        ref, deadline = g.actors[rank].heartbeat.remote(), time.monotonic() + 10
        while not ray.wait([ref], timeout=1.0)[0]:  # a stop request (Ctrl-C) is answered within a second
            if time.monotonic() >= deadline or _stop_requested_at[0] is not None:
                return
        try:
            beat = ray.get(ref)
        except Exception:
            return
        if beat.get("problems"):
            what = describe(beat["problems"])
            raise ClusterError(f"{g.role} worker {rank}: engine process {what} ({cause.__class__.__name__}: "
                               f"{cause})", g.role, rank, dead=True)


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
