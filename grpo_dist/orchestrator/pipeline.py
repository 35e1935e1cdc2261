"""The batch rollout pipeline on the driver: generation up to ``depth`` steps ahead of the learner.

``trainer.max_staleness`` k (adapter versions) gives ``depth = k / algo.num_iterations`` trainer
steps of look-ahead. The trainer submits the batches for steps t+1..t+depth before the learner
trains on step t; each is a queue entry (:class:`Pending`) whose prompts went to the rollout
engines in chunks, every chunk to the engine with the fewest outstanding prompts.

Versions need no locks: a Ray actor runs its calls in order, so a chunk submitted before the
``load_update`` of version v runs with the weights before v and one submitted after it runs
with v. With depth >= 1 the weight sync is therefore *not* awaited
(``grpo_dist.sync.weight_sync.WeightSync.push``): the engine loads v after the chunks already
queued on it, and the driver settles the load's answer later.
A sample's version is the one its engine really held (``Rollout.adapter_version``); the driver
checks that none is more than k behind the learner.

A chunk whose engine died or hung is sent again, with the same prompts and seed keys, once the
engine is replaced (``cluster/recovery.py``): same completions whichever engine runs it, only a
newer (never older) adapter version. The resume point while batches are pending is the stream
position before the oldest of them.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable

import ray

from grpo_dist.cluster.ray_utils import ActorGroup, ClusterError
from grpo_dist.orchestrator import dispatch
from grpo_dist.types import RewardResult, RolloutGroup


@dataclass
class Chunk:
    lo: int  # prompt range [lo, hi) of its batch
    hi: int
    rank: int  # the rollout engine it was sent to ...
    actor: Any  # ... and that engine's handle then (a replaced engine has a new one)
    ref: Any
    done: bool = False


@dataclass
class Pending:
    """One batch of prompts submitted for trainer step ``step`` (1-based)."""

    step: int
    records: list
    keys: list
    data_before: dict | None  # the prompt stream's position before these prompts
    chunks: list[Chunk] = field(default_factory=list)


@dataclass
class Scored:
    """A collected batch: its groups in prompt order, their scores, and what the pipeline saw
    (``rollout/…`` metrics: engines used, groups scored before the batch finished generating)."""

    groups: list[RolloutGroup]
    scores: RewardResult
    metrics: dict[str, float] = field(default_factory=dict)


class RolloutPipeline:
    """Batches of prompts, in chunks per engine; scored by the reward actors once a batch is in."""

    def __init__(self, rollout: ActorGroup, reward: ActorGroup, recovery, timeout: float | None, chunk: int = 0):
        self.rollout, self.reward, self.recovery, self.timeout, self.chunk = rollout, reward, recovery, timeout, chunk
        self.queue: deque[Pending] = deque()  # batches submitted ahead, in step order
        self._live: list[Chunk] = []  # chunks whose completion the driver has not seen

    # -- generation ------------------------------------------------------------------------
    def outstanding(self) -> list[int]:
        """Prompts submitted to each engine whose chunk has not finished (polled, no waiting)."""
        self._live = [c for c in self._live if not c.done]
        if self._live:
            ready, _ = ray.wait([c.ref for c in self._live], num_returns=len(self._live), timeout=0)
            ids = {r.hex() for r in ready}
            for c in self._live:
                c.done = c.ref.hex() in ids
        counts = [0] * len(self.rollout)
        for c in self._live:
            if not c.done and c.rank < len(counts):
                counts[c.rank] += c.hi - c.lo
        return counts

    def submit(self, step: int, records: list, keys: list, data_before: dict | None = None,
               queue: bool = True) -> Pending:
        """Send a batch's prompts to the engines (chunks to the least-loaded engine first)."""
        p = Pending(step, records, keys, data_before)
        bounds = dispatch.chunk_bounds(len(records), len(self.rollout), self.chunk)
        ranks = dispatch.assign_chunks([hi - lo for lo, hi in bounds], self.outstanding())
        p.chunks = [self._send(p, lo, hi, r) for (lo, hi), r in zip(bounds, ranks)]
        if queue:
            self.queue.append(p)
        return p

    def _send(self, p: Pending, lo: int, hi: int, rank: int) -> Chunk:
        actor = self.rollout.actors[rank]
        c = Chunk(lo, hi, rank, actor, actor.generate.remote(p.records[lo:hi], keys=p.keys[lo:hi]))
        self._live.append(c)
        return c

    def take(self, step: int) -> Pending | None:
        """The batch submitted ahead for ``step``, if any (removed from the queue)."""
        if self.queue and self.queue[0].step == step:
            return self.queue.popleft()
        return None

    def collect(self, p: Pending) -> list[RolloutGroup]:
        """Wait for a batch's chunks; groups in prompt order. A dead or hung engine is replaced
        and its chunks (of this batch; other batches' when they are collected) sent again."""
        def refresh(c: Chunk) -> Chunk:
            if c.actor is self.rollout.actors[c.rank]:
                return c
            c.done = True  # its engine was replaced meanwhile: the chunk goes to the least-loaded engine
            return self._send(p, c.lo, c.hi, dispatch.assign_chunks([c.hi - c.lo], self.outstanding())[0])

        parts = self._gather(p.chunks, refresh, lambda chunks: self.rollout.get(
            [c.ref for c in chunks], timeout=self.timeout, ranks=[c.rank for c in chunks]))
        for c in p.chunks:
            c.done = True
        return dispatch.merge_in_order([(c.lo, part) for c, part in zip(p.chunks, parts)])

    def _gather(self, units: list, refresh: Callable[[Any], Any], get: Callable[[list], Any]) -> Any:
        """``get(units)``, after ``refresh`` replaced (in place) each unit whose actor was replaced
        since it was sent (sent again); on a dead or hung actor, recovery replaces it (or
        re-raises) and the wait starts over. The one recovery loop of both pipelines."""
        while True:
            units[:] = [refresh(u) for u in units]
            try:
                return get(units)
            except ClusterError as e:
                self.recovery.handle(e)  # replaces the actor (with the current weights) or re-raises

    def score(self, p: Pending, groups: list[RolloutGroup]) -> Scored:
        """The scores of a collected batch (sharded over the reward actors)."""
        return Scored(groups, self.recovery.run(dispatch.score, self.reward, groups))

    def scored(self, p: Pending) -> Scored:
        """A batch's groups (:meth:`collect`) and their scores (:meth:`score`)."""
        return self.score(p, self.collect(p))

    def data_before(self) -> dict | None:
        """The stream position before every prompt submitted and not yet trained on (None: none)."""
        return self.queue[0].data_before if self.queue else None

    def on_version(self, version: int) -> None:
        """A weight load of ``version`` was just sent to every engine (calls run in order: nothing to do)."""
