"""The driver's side of the weight sync: one ``push`` per learner version, both halves issued together.

A transport has a learner half (runs on every learner rank: ZeRO-3 gathers partitioned weights
in a collective; rank 0's answer is the payload) and an engine half (runs on every rollout
engine). :class:`WeightSync` issues both in one call, so a transport whose halves must meet
(a broadcast over a process group) can be entered by all parties at once:

* ``setup(learners, engines, recovery)`` -- the actor groups (and the dead-actor handler);
* ``push(version, wait)`` -- learner half (``timing/sync_publish``), then the engine half on every
  engine (``timing/sync_transfer``: the loads' wall time past the slowest engine's own). ``wait``: the
  engines' answers are awaited (on-policy); otherwise they are settled later (:meth:`settle`),
  and, since an actor runs its calls in order, every generation submitted after the push runs
  with the new version;
* ``on_replace(rank, actor)`` -- a replaced engine gets the newest version before it generates.

The payload transports (``object_store``, ``filesystem``) publish on the learner
(``Learner.publish_update``) and the engine receives (``RolloutWorker.load_update``): see
:mod:`grpo_dist.sync.base`. Listeners (``on_push``) hear of each version as its loads are sent
(the streaming rollout starts later groups at that version or newer).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Optional

import ray

from grpo_dist.cluster.ray_utils import ActorGroup, ClusterError


@dataclass
class Load:
    rank: int
    actor: Any  # the engine's handle when the load was sent (a replaced engine has a new one)
    ref: Any
    version: int


def sync_clocks(results: list[dict[str, float]]) -> dict[str, float]:
    """``timing/sync_merge|write|load|wake``: where the rollout workers' weight loads spent their
    time (merging an adapter into the base, writing the version, the engine loading it, a sleeping
    engine waking: colocated on GPU), the slowest worker's of each; from the ``load_update``
    answers that carry them."""
    return {f"timing/sync_{k[:-2]}": max(r[k] for r in results) for k in ("merge_s", "write_s", "load_s", "wake_s")
            if results and all(k in r for r in results)}


class WeightSync:
    """``allow_newer``: an engine may answer a load with a newer version than sent (async engines
    run loads out of order and skip one a newer load overtook)."""

    def __init__(self, allow_newer: bool = False):
        self.allow_newer = allow_newer
        self.learners: ActorGroup | None = None
        self.engines: ActorGroup | None = None
        self.recovery = None
        self.version = 0  # the newest version pushed (= the learner's)
        self.loads: list[Load] = []  # engine halves sent and not yet answered
        self.on_push: list[Callable[[int], None]] = []
        self._payload: Any = None  # the newest version's payload (for replaced engines)

    def setup(self, learners: ActorGroup, engines: ActorGroup, recovery=None) -> None:
        self.learners, self.engines, self.recovery = learners, engines, recovery

    # -- the two halves ------------------------------------------------------------------------
    def _learner_half(self, version: Optional[int]) -> Any:
        """A Ray ref to the payload of the learner's current weights (every rank is called), made:
        the engines' loads are sent only once it exists. A load sent before would wait for it inside
        Ray, and every later call to that engine, its heartbeat too, would queue behind it: a
        stopped learner would read as a silent engine, be replaced, and blamed again. Waited on
        here, with the learners' heartbeats, a stopped learner is named.

        ``version``: the one every rank must publish (the driver's push); None (a restore): the one
        rank 0 publishes. A rank at another version (it missed or repeated an update) raises a
        ClusterError naming it, before any engine is sent the payload."""
        pairs = [a.publish_update.options(num_returns=2).remote() for a in self.learners.actors]
        got = self.learners.get([v for v, _ in pairs])  # never the payload: it stays in the store
        want, of = (got[0], "of rank 0") if version is None else (version, "pushed")
        for rank, v in enumerate(got):
            if v != want:
                raise ClusterError(f"weight sync: learner rank {rank} published version {v}, not the version "
                                   f"{want} {of}", "learner", rank)
        return pairs[0][1]

    def _engine_half(self, actor: Any, payload: Any) -> Any:
        return actor.load_update.remote(payload)

    # -- the driver's calls ----------------------------------------------------------------------
    def push(self, version: int, wait: bool = True) -> dict[str, float]:
        """Send ``version`` (the learner's, after its update) to every engine; the metrics of the
        loads answered (all of them with ``wait``)."""
        t0 = time.perf_counter()
        self._payload = self._learner_half(version)
        t1 = time.perf_counter()
        self.loads += [Load(r, a, self._engine_half(a, self._payload), version)
                       for r, a in enumerate(self.engines.actors)]
        self.version = version
        for fn in self.on_push:
            fn(version)
        done = self.settle(block=wait)
        m = {"sync/version": float(version), "timing/sync_publish": t1 - t0}
        if done:
            m.update({"sync/bytes": float(done[-1]["bytes"]), "sync/seconds": max(r["seconds"] for r in done),
                      **sync_clocks(done)})
            if wait:  # the loads' wall time past the slowest engine's own: the payload's way there, the calls
                m["timing/sync_transfer"] = max(0.0, time.perf_counter() - t1 - m["sync/seconds"])
        return m

    def settle(self, block: bool = False) -> list[dict]:
        """Answers of the loads that are in (all of them with ``block``). A load sent to an engine
        replaced since is dropped: the replacement was given the newest version (:meth:`on_replace`)."""
        done: list[dict] = []
        for ld in list(self.loads):
            if ld.actor is not self.engines.actors[ld.rank]:
                self.loads.remove(ld)
                continue
            if not block and not ray.wait([ld.ref], timeout=0)[0]:
                continue
            self.loads.remove(ld)
            try:
                r = self.engines.get([ld.ref], ranks=[ld.rank])[0]
            except ClusterError as e:
                if self.recovery is None:
                    raise
                self.recovery.handle(e)  # replaced, and given the newest version
                continue
            got = r["version"]
            if got != ld.version and not (self.allow_newer and got > ld.version):
                raise ClusterError(f"rollout worker {ld.rank} loaded version {got}, expected {ld.version}",
                                   "rollout", ld.rank)
            done.append(r)
        return done

    def on_replace(self, rank: int, actor: Any, timeout: float | None = None) -> None:
        """A fresh engine at ``rank`` (set up, serving the base model) loads the newest version."""
        if self._payload is not None:
            self.engines.get([self._engine_half(actor, self._payload)], timeout=timeout, ranks=[rank])

    def restore(self) -> int:
        """After a resume: every engine loads the learner's restored weights (a dead engine is
        replaced and the loads sent again); returns their version, now the sync's."""
        self._payload = self._learner_half(None)  # the restored version: whatever the learner resumed at

        def load_all() -> list[dict]:
            return self.engines.get([self._engine_half(a, self._payload) for a in self.engines.actors])

        results = self.recovery.run(load_all) if self.recovery is not None else load_all()
        return self._restored({r["version"] for r in results})

    def _restored(self, versions: set[int]) -> int:
        """The one version every party answered after a restore becomes the sync's (and listeners hear it)."""
        if len(versions) != 1:
            raise ClusterError(f"rollout workers disagree on the restored weight version: {sorted(versions)}", "rollout")
        self.version = versions.pop()
        for fn in self.on_push:
            fn(self.version)
        return self.version
