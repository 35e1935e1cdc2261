"""``sync.transport: collective``: the driver's side of weights broadcast over a process group.

Learner rank 0 and every rollout engine form one group of their own (gloo on CPU engines, through
the vLLM worker extension ``grpo_dist.rollout.vllm_weight_ext``; vLLM's NCCL weight transfer on
GPUs, ``grpo_dist.sync.nccl_api``), separate from the learner ranks' DeepSpeed group:

* ``setup``: the learner's manifest (what every broadcast carries), an address and a free port
  from learner rank 0 (``rendezvous_address``), then every party joins at once;
* ``push(version)``: the learner half (``Learner.broadcast_weights`` on every rank: ZeRO-3 gathers;
  rank 0 sends the buckets) and the engine half (``RolloutWorker.receive_weights`` on every
  engine: receives and loads in place) issued together, as a collective needs;
* ``on_replace``: a group cannot take a newcomer, so a replaced engine means a new group (the old
  one's calls answered or timed out first) and the newest weights broadcast again to all.

A broken sync never hangs the learner: every collective has ``sync.timeout_s``. After a failed
push the driver waits for every party's answer; a dead or silent engine is replaced (within
``cluster.max_restarts``: a new group, the weights sent again), anything else stops the run with
one ClusterError naming the version and the first failure.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Optional

import ray

from grpo_dist.cluster.ray_utils import POLL_S, STOP_GRACE_S, ClusterError, stop_requested_at
from grpo_dist.sync import nccl_api
from grpo_dist.sync.weight_sync import Load, WeightSync, sync_clocks


@dataclass
class _Load(Load):
    epoch: int = 0  # the group it was sent on


class CollectiveSync(WeightSync):
    def __init__(self, cfg):
        super().__init__(allow_newer=True)  # a version sent to a replaced engine's group may be the learner's newer one
        self.cfg = cfg
        self.nccl = nccl_api.uses_nccl(cfg)
        self.epoch = 0  # groups formed so far
        self.seq = 0  # broadcasts on the current group
        self.manifest: Optional[dict[str, Any]] = None
        self.sent: list[tuple[int, Any]] = []  # learner halves (epoch, rank 0's ref) not yet answered
        self.inflight: list[tuple[Any, str, int]] = []  # every call on the group that may still run
        self.learner_done: list[dict] = []
        self.pushed = False  # a broadcast was issued (engines no longer serve the base model's weights)

    @property
    def timeout(self) -> float:
        return float(self.cfg.sync.timeout_s)

    def setup(self, learners, engines, recovery=None) -> None:
        super().setup(learners, engines, recovery)
        self._form_group()

    # -- the group -------------------------------------------------------------------------------
    def _form_group(self) -> bool:
        """A new group of learner rank 0 and every engine (after the old group's calls are done).
        False when an engine died meanwhile and its replacement formed the group (``on_replace``)."""
        self._drain()
        L, E = self.learners, self.engines
        if self.manifest is None:  # every learner rank (ZeRO-3 gathers); rank 0 answers
            self.manifest = L.get(L.call("weight_manifest"))[0]
        where = L.get([L.actors[0].rendezvous_address.remote()], timeout=self.timeout, ranks=[0])[0]
        self.epoch, self.seq = self.epoch + 1, 0
        world = 1 + len(E)
        lref = L.actors[0].join_weight_group.remote(where["ip"], where["port"], world, self.epoch, self.nccl)
        erefs = [a.join_weight_group.remote(where["ip"], where["port"], world, r + 1, self.epoch, self.manifest)
                 for r, a in enumerate(E.actors)]
        self.inflight = [(lref, "learner", 0)] + [(ref, "rollout", r) for r, ref in enumerate(erefs)]
        try:
            E.get(erefs, timeout=self.timeout + 60)
            L.get([lref], timeout=self.timeout + 60, ranks=[0])
        except ClusterError as e:
            if self.recovery is None or e.role != "rollout" or not (e.dead or e.hung):
                raise ClusterError(f"weight sync: forming the weight group failed: {e}", e.role, e.rank,
                                   dead=e.dead, hung=e.hung) from e
            self.recovery.handle(e)  # replaced: on_replace forms the group again and sends the weights
            return False
        self.inflight = []
        return True

    def _drain(self) -> list[ClusterError]:
        """Wait for every call issued on the current group (a failed broadcast's peers time out on
        their own within sync.timeout_s); the failures among them. A call that never answers is
        reported hung (raised)."""
        inflight, self.inflight, self.sent, self.loads = self.inflight, [], [], []
        if not inflight:
            return []
        limit = 2 * self.timeout + 60
        waiting, deadline = [ref for ref, _, _ in inflight], time.monotonic() + limit
        while waiting and time.monotonic() < deadline:  # in slices: a stop request (Ctrl-C) is answered
            _, waiting = ray.wait(waiting, num_returns=len(waiting), timeout=min(POLL_S, deadline - time.monotonic()))
            stop_at = stop_requested_at()
            if waiting and stop_at is not None and time.monotonic() - stop_at >= STOP_GRACE_S:
                role, rank = next((role, rank) for ref, role, rank in inflight if ref.hex() == waiting[0].hex())
                raise ClusterError(f"{role} worker {rank}: no answer from the weight group {STOP_GRACE_S:g} s after "
                                   f"the stop request (hung)", role, rank, hung=True, interrupted=True)
        late = {r.hex() for r in waiting}
        errors = []
        for ref, role, rank in inflight:
            if ref.hex() in late:
                raise ClusterError(f"{role} worker {rank}: no answer from the weight group within {limit:g} s "
                                   f"(hung)", role, rank, hung=True)
            group = self.learners if role == "learner" else self.engines
            try:
                group.get([ref], ranks=[rank])
            except ClusterError as e:
                errors.append(e)
        return errors

    # -- the driver's calls ----------------------------------------------------------------------
    def push(self, version: int, wait: bool = True) -> dict[str, float]:
        self._issue(version)
        for fn in self.on_push:
            fn(version)
        before = len(self.learner_done)
        done = self.settle(block=wait)
        return self._metrics(version, done, self.learner_done[before:])

    def _issue(self, version: int) -> None:
        self.seq, self.pushed = self.seq + 1, True
        L, E = self.learners, self.engines
        lrefs = L.call("broadcast_weights", self.seq)  # every rank; rank 0 sends
        self.sent.append((self.epoch, lrefs[0]))
        loads = [_Load(r, a, a.receive_weights.remote(self.seq, self.epoch, version), version, self.epoch)
                 for r, a in enumerate(E.actors)]
        self.loads += loads
        self.inflight += [(lrefs[0], "learner", 0)] + [(ld.ref, "rollout", ld.rank) for ld in loads]
        self.version = version

    def settle(self, block: bool = False) -> list[dict]:
        """The engines' answers that are in (all of them with ``block``); the learner's are kept
        in ``learner_done``. A failure waits for every party, then replaces what died or stops."""
        # loads of an older group, or to an engine replaced since, were superseded by a re-send
        self.loads = [ld for ld in self.loads if ld.epoch == self.epoch and ld.actor is self.engines.actors[ld.rank]]
        self.sent = [(ep, ref) for ep, ref in self.sent if ep == self.epoch]

        def ready(ref) -> bool:
            return block or bool(ray.wait([ref], timeout=0)[0])

        done, errors, answered = [], [], set()
        for item in list(self.sent):  # bounded: every collective of rank 0 times out (sync.timeout_s)
            if ready(item[1]):
                self.sent.remove(item)
                answered.add(item[1].hex())
                try:
                    self.learner_done.append(self.learners.get([item[1]], ranks=[0])[0])
                except ClusterError as e:
                    errors.append(e)
        for ld in list(self.loads):
            if errors:
                break
            if ready(ld.ref):  # the learner's half is done: the engine has its bytes and is loading
                self.loads.remove(ld)
                answered.add(ld.ref.hex())
                try:
                    r = self.engines.get([ld.ref], timeout=self.timeout + 60, ranks=[ld.rank])[0]
                except ClusterError as e:
                    errors.append(e)
                    continue
                if ld.version is not None and r["version"] < ld.version:
                    raise ClusterError(f"rollout worker {ld.rank} loaded version {r['version']}, expected "
                                       f"{ld.version}", "rollout", ld.rank)
                done.append(r)
        if errors:
            return self._recover(errors)
        self.inflight = [(ref, role, rank) for ref, role, rank in self.inflight if ref.hex() not in answered]
        return done

    def _recover(self, errors: list[ClusterError]) -> list[dict]:
        """After a failed push: every party's answer (or its timeout), then each dead or silent
        engine replaced (a new group, the weights sent again), or one clear error."""
        actors = list(self.engines.actors)
        try:
            errors += self._drain()
        except ClusterError as e:
            errors.append(e)
        lost = [e for e in errors if e.role == "rollout" and (e.dead or e.hung) and e.rank is not None]
        if self.recovery is None or not lost or any(e.role == "learner" and (e.dead or e.hung) for e in errors):
            first = next((e for e in errors if e.dead or e.hung), errors[0])
            raise ClusterError(f"weight sync of version {self.version} failed: {first}", first.role, first.rank,
                               dead=first.dead, hung=first.hung) from first
        for e in lost:
            if self.engines.actors[e.rank] is actors[e.rank]:  # not replaced yet by an earlier one's re-send
                self.recovery.handle(e)  # -> on_replace: a new group, the newest weights sent to all
        return []

    def on_replace(self, rank: int, actor: Any, timeout: float | None = None) -> None:
        """A fresh engine at ``rank``: a new group with it, then the newest weights to every engine
        (it must not generate with the base model's)."""
        if self._form_group() and self.pushed:
            self._issue(self.version)
            self.settle(block=True)

    def restore(self) -> int:
        """After a resume: every engine gets the learner's restored weights, sent with their
        version (learner rank 0's, asked first: vLLM's NCCL transfer carries none); their version."""
        L = self.learners
        version = int(L.get([L.actors[0].weights_version.remote()], timeout=self.timeout, ranks=[0])[0])

        def go() -> list[dict]:
            self._issue(version)
            return self.settle(block=True)

        results = self.recovery.run(go) if self.recovery is not None else go()
        learner = self.learner_done[-1] if self.learner_done else {}
        return self._restored({r["version"] for r in results} | ({learner["version"]} if "version" in learner else set()))

    def _metrics(self, version: int, done: list[dict], learner: list[dict]) -> dict[str, float]:
        """``sync/*`` of the broadcasts answered during this push (a push that is not awaited
        reports the earlier ones that finished meanwhile)."""
        m = {"sync/version": float(version)}
        if learner:
            lr = learner[-1]
            m.update({"sync/bytes": float(lr["bytes"]), "sync/learner_seconds": float(lr["seconds"]),
                      "sync/buckets": float(lr["buckets"])})
            if lr.get("peak_extra_bytes") is not None:
                m["sync/learner_peak_extra_mb"] = lr["peak_extra_bytes"] / 2**20
        if done:
            m["sync/seconds"] = max([r["seconds"] for r in done] + [m.get("sync/learner_seconds", 0.0)])
            peaks = [r["peak_extra_bytes"] for r in done if r.get("peak_extra_bytes") is not None]
            if peaks:
                m["sync/engine_peak_extra_mb"] = max(peaks) / 2**20
            m.update(sync_clocks(done))
        return m
