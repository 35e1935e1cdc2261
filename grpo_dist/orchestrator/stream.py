"""The streaming pipeline on the driver (``rollout.streaming``): one request per group, scored at once.

Same interface as :class:`~grpo_dist.orchestrator.pipeline.RolloutPipeline` (submit / take / scored /
generate / data_before / on_version), so the rollout manager does not branch on it. Each prompt of a batch goes, as its own call, to the rollout engine with the
fewest outstanding groups (async actors running vLLM's ``AsyncLLM``, which batches whatever is in
flight). Its scoring call is submitted at the same moment with the generation's ObjectRef as its
argument: Ray starts it on the reward actor as soon as that group finishes, without the driver,
whether the driver is waiting for the learner or not. Scored groups wait in the queue of batches
(the bounded buffer: at most ``capacity`` groups, the batches of the steps allowed ahead) until
the driver takes a batch; :meth:`scored` returns it in prompt order with its scores.

Versions: an async actor runs its calls out of order, so each group carries ``min_version``, the
newest version whose load was sent before it; the engine starts it with that version or a newer
one. Every sample carries the version it ran with; the driver checks staleness as for the
batch pipeline. A dead engine's (or reward actor's) groups are sent again with the same seed keys.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import ray

from grpo_dist.cluster.ray_utils import ActorGroup
from grpo_dist.orchestrator import dispatch
from grpo_dist.orchestrator.pipeline import RolloutPipeline, Scored


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
    result: Scored | None = None  # groups and scores, once collected


class BufferFull(RuntimeError):
    pass


class StreamPipeline(RolloutPipeline):
    def __init__(self, rollout: ActorGroup, reward: ActorGroup, recovery, timeout: float | None, capacity: int,
                 inflight: bool = False):
        super().__init__(rollout, reward, recovery, timeout)
        self.capacity = capacity
        self.inflight = inflight  # rollout.inflight_updates: the engines' loads are reported per batch
        self.min_version = 0  # the newest version whose load was sent to every engine
        self.buffer_peak = 0  # most groups waiting (generating, scoring or scored) in the queue
        self._items: list[Item] = []  # generations the driver has not seen finish

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
    def collect(self, p: Pending) -> list:
        """Wait for a batch's groups and their scores (in prompt order); the scores wait in ``p``
        for :meth:`score`. Metrics: how many groups were scored before the batch's last group
        finished generating, the engine of each group."""
        def refresh(it: Item) -> Item:
            if it.actor is not self.rollout.actors[it.rank]:  # its engine was replaced meanwhile
                return self._send(p, it.index, dispatch.assign_chunks([1], self.outstanding())[0])
            if it.reward_actor is not self.reward.actors[it.reward_rank]:
                self._score(it)
            return it

        def get(items: list[Item]) -> tuple[list, list]:
            return (self.rollout.get([it.gen for it in items], timeout=self.timeout, ranks=[it.rank for it in items]),
                    self.reward.get([it.score for it in items], ranks=[it.reward_rank for it in items]))

        gens, scored = self._gather(p.items, refresh, get)
        last = max(t for _, t in gens)
        ranks = [it.rank for it in p.items]
        m = {"rollout/groups_scored_early": float(sum(t < last for _, t in scored)),
             "rollout/score_lag_s": max(max(0.0, s - g) for (_, g), (_, s) in zip(gens, scored)),
             "rollout/engines_used": float(len(set(ranks)))}
        m.update({f"rollout/groups_on_engine/{r}": float(ranks.count(r)) for r in sorted(set(ranks))})
        if self.inflight:
            m.update(load_metrics(self.rollout.get(self.rollout.call("inflight_loads"))))
        p.result = Scored([g for g, _ in gens], dispatch.merge_scores([s for s, _ in scored]), m)
        return p.result.groups

    def score(self, p: Pending, groups: list) -> Scored:
        """The scores :meth:`collect` gathered (each group was scored as it finished)."""
        return p.result

    def on_version(self, version: int) -> None:
        """Every engine serves ``version`` to the groups sent from now on (its load was just sent)."""
        self.min_version = version


def load_metrics(per_engine: list[list[dict]]) -> dict[str, float]:
    """In-flight loads since the last batch, over the engines: ``rollout/inflight_updates`` (loads
    that found groups running), ``rollout/inflight_loads`` (all), the groups they kept running, the
    seconds generation stood paused (``inflight_paused_s``: the pause, the load and the resume;
    ``_max`` the longest) and when the last one resumed (``inflight_last_resumed_at``, wall time)."""
    loads = [x for e in per_engine for x in e]
    paused = [x["paused_s"] for x in loads]
    m = {"rollout/inflight_loads": float(len(loads)),
         "rollout/inflight_updates": float(sum(x["kept"] > 0 for x in loads)),
         "rollout/inflight_kept_groups": float(sum(x["kept"] for x in loads)),
         "rollout/inflight_paused_s": float(sum(paused)),
         "rollout/inflight_paused_s_max": float(max(paused, default=0.0))}
    if loads:
        m["rollout/inflight_last_resumed_at"] = max(x["resumed_at"] for x in loads)
    return m
