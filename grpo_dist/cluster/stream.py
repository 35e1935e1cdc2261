"""The streaming pipeline on the driver (``rollout.streaming``): one request per group, scored at once.

Same interface as :class:`~grpo_dist.cluster.pipeline.RolloutPipeline` (submit / take / collect /
generate / load / settle_loads / data_before), plus :meth:`StreamPipeline.score`, so the trainer
changes little. Each prompt of a batch goes, as its own call, to the rollout engine with the
fewest outstanding groups (async actors running vLLM's ``AsyncLLM``, which batches whatever is in
flight). Its scoring call is submitted at the same moment with the generation's ObjectRef as its
argument: Ray starts it on the reward actor as soon as that group finishes, without the driver,
whether the driver is waiting for the learner or not. Scored groups wait in the queue of batches
(the bounded buffer: at most ``capacity`` groups, the batches of the steps allowed ahead) until
the trainer takes a batch; :meth:`collect` returns it in prompt order and :meth:`score` its
scores, so the trainer does not score again.

Versions: an async actor runs its calls out of order, so each group carries ``min_version``, the
newest version whose load was sent before it; the engine starts it with that version or a newer
one. Every sample carries the version it ran with; the trainer checks staleness as for the
batch pipeline. A dead engine's (or reward actor's) groups are sent again with the same seed keys.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

import ray

from grpo_dist.cluster import dispatch
from grpo_dist.cluster.pipeline import Load, RolloutPipeline
from grpo_dist.cluster.ray_utils import ActorGroup, ClusterError
from grpo_dist.types import RewardResult, RolloutGroup


@dataclass
class Item:
    """One group in flight: its generation and its scoring."""

    index: int  # position in its batch
    rank: int  # rollout engine ...
    actor: Any  # ... and that engine's handle then
    gen: Any
    reward_rank: int
    reward_actor: Any
    score: Any


@dataclass
class Pending:
    step: int
    records: list
    keys: list
    data_before: dict | None
    items: list[Item] = field(default_factory=list)


class BufferFull(RuntimeError):
    pass


class StreamPipeline(RolloutPipeline):
    def __init__(self, rollout: ActorGroup, reward: ActorGroup, recovery, timeout: float | None, capacity: int):
        super().__init__(rollout, recovery, timeout)
        self.reward, self.capacity = reward, capacity
        self.min_version = 0  # the newest version whose load was sent to every engine
        self.buffer_peak = 0  # most groups waiting (generating, scoring or scored) in the queue
        self.timeline: list[dict] = []  # per collected batch: when each group finished and was scored
        self._items: list[Item] = []  # generations the driver has not seen finish
        self._scores: dict[int, RewardResult] = {}  # id(group) -> its scores, until score() takes them

    # -- dispatch ----------------------------------------------------------------------------
    def outstanding(self) -> list[int]:
        """Groups each engine has not finished (polled, no waiting)."""
        if self._items:
            ready, _ = ray.wait([i.gen for i in self._items], num_returns=len(self._items), timeout=0)
            done = {r.hex() for r in ready}
            self._items = [i for i in self._items if i.gen.hex() not in done]
        counts = [0] * len(self.rollout)
        for i in self._items:
            if i.rank < len(counts) and i.actor is self.rollout.actors[i.rank]:
                counts[i.rank] += 1
        return counts

    def buffered(self) -> int:
        return sum(len(p.items) for p in self.queue)

    def submit(self, step: int, records: list, keys: list, data_before: dict | None = None,
               queue: bool = True) -> Pending:
        """Send every prompt as its own group request (to the least-busy engine) and its scoring."""
        if queue and self.buffered() + len(records) > self.capacity:
            raise BufferFull(f"step {step}: {self.buffered()} groups buffered + {len(records)} > capacity {self.capacity}")
        p = Pending(step, records, keys, data_before)
        load = self.outstanding()
        for i in range(len(records)):
            rank = dispatch.assign_chunks([1], load)[0]
            load[rank] += 1
            p.items.append(self._send(p, i, rank))
        if queue:
            self.queue.append(p)
            self.buffer_peak = max(self.buffer_peak, self.buffered())
        return p

    def _send(self, p: Pending, i: int, rank: int) -> Item:
        actor = self.rollout.actors[rank]
        gen = actor.generate_group.remote(p.records[i], p.keys[i], self.min_version)
        item = Item(i, rank, actor, gen, 0, None, None)
        self._score(item)
        self._items.append(item)
        return item

    def _score(self, item: Item) -> None:
        """Chain the group's scoring onto its generation (round robin over the reward actors)."""
        item.reward_rank = (item.index + item.rank) % len(self.reward)
        item.reward_actor = self.reward.actors[item.reward_rank]
        item.score = item.reward_actor.score_group.remote(item.gen)

    # -- collection --------------------------------------------------------------------------
    def collect(self, p: Pending) -> list[RolloutGroup]:
        """Wait for a batch's groups and scores; groups in prompt order (scores: :meth:`score`)."""
        while True:
            for j, it in enumerate(p.items):
                if it.actor is not self.rollout.actors[it.rank]:  # its engine was replaced meanwhile
                    rank = dispatch.assign_chunks([1], self.outstanding())[0]
                    p.items[j] = self._send(p, it.index, rank)
                elif it.reward_actor is not self.reward.actors[it.reward_rank]:
                    self._score(it)
            try:
                gens = self.rollout.get([it.gen for it in p.items], timeout=self.timeout,
                                        ranks=[it.rank for it in p.items])
                scored = self.reward.get([it.score for it in p.items], ranks=[it.reward_rank for it in p.items])
            except ClusterError as e:
                self.recovery.handle(e)  # replaces the actor (with the current weights) or re-raises
                continue
            break
        groups = []
        for (g, _), (s, _) in zip(gens, scored):
            self._scores[id(g)] = s
            groups.append(g)
        self.timeline.append({"step": p.step, "generated": [x[1] for x in gens], "scored": [x[1] for x in scored],
                              "ranks": [it.rank for it in p.items]})
        return groups

    def score(self, groups: list[RolloutGroup]) -> RewardResult:
        """The scores of groups :meth:`collect` returned (taken: each group is scored once)."""
        missing = [g.prompt_id for g in groups if id(g) not in self._scores]
        if missing:
            raise KeyError(f"groups of prompts {missing} were not collected from this pipeline")
        return dispatch.merge_scores([self._scores.pop(id(g)) for g in groups])

    # -- weight sync -------------------------------------------------------------------------
    def load(self, update: Any, version: int) -> None:
        """Every engine serves ``version`` to the groups sent from now on (not awaited)."""
        self.loads += [Load(r, a, a.load_update.remote(update), version) for r, a in enumerate(self.rollout.actors)]
        self.min_version = version

    def _loaded(self, got: int, sent: int) -> bool:
        return got >= sent  # a newer load may overtake this one on the async actor (then skipped)
