"""The rollout manager: scored batches for the driver, batch or streaming behind one interface.

It owns the prompt stream's bookkeeping (which prompts, with which sampling-seed keys), the
pipeline (``rollout.streaming``: :class:`~grpo_dist.orchestrator.stream.StreamPipeline`, else
:class:`~grpo_dist.orchestrator.pipeline.RolloutPipeline`), the staleness bound (batches of steps up to
``depth = trainer.max_staleness / algo.num_iterations`` ahead of the learner), dynamic sampling
(zero-spread groups dropped and refilled, bounded) and the reward-failure watch.
"""

from __future__ import annotations

from typing import Any

from grpo_dist.batch import zero_spread
from grpo_dist.config import Config
from grpo_dist.data import PromptStream
from grpo_dist.orchestrator.env_errors import EnvErrorWatch
from grpo_dist.reward.failures import FailureWatch
from grpo_dist.orchestrator.pipeline import RolloutPipeline, Scored
from grpo_dist.orchestrator.stream import StreamPipeline
from grpo_dist.types import RewardResult


class RolloutManager:
    def __init__(self, cfg: Config, rollout, reward, recovery, stream: PromptStream):
        self.cfg, self.stream = cfg, stream
        self.depth = cfg.trainer.max_staleness // cfg.algo.num_iterations  # steps generation runs ahead
        r = cfg.rollout
        if r.streaming:  # one request per group, each scored as soon as it is generated
            self.pipeline: RolloutPipeline = StreamPipeline(rollout, reward, recovery, r.generate_timeout_s,
                                                            r.prompts_per_step * (self.depth + 1),
                                                            inflight=r.inflight_updates)
        else:
            self.pipeline = RolloutPipeline(rollout, reward, recovery, r.generate_timeout_s,
                                            chunk=cfg.trainer.dispatch_chunk)
        self.watch = FailureWatch(cfg.reward)  # stops a run whose reward function keeps failing
        self.env_watch = EnvErrorWatch(r, cfg.reward.failure_window)  # ... or whose environment / agent keeps raising

    def scored_batch(self, step: int, timer) -> tuple[list, RewardResult, dict[str, float]]:
        """Step ``step``'s groups and scores: the batch generated ahead for it, or generated now.
        With dynamic sampling, zero-spread groups are dropped and refilled (bounded rounds).
        Raises RewardFailureError for a reward function that keeps failing (reward/failures.py), and
        its subclass EnvErrorRateError for an environment or agent that keeps raising (env_errors.py)."""
        cfg, G = self.cfg, self.cfg.rollout.group_size
        want = cfg.rollout.prompts_per_step
        kept, totals, per_fn, errors, m = [], [], {}, {}, {}
        rounds = seen = 0
        while True:
            pending = self.pipeline.take(step) if rounds == 0 else None
            if pending is not None:
                with timer("generate_wait"):  # what the learner's update did not hide
                    groups = self.pipeline.collect(pending)
            else:
                with timer("generate"):
                    pending = self.pipeline.submit(step, *self.draw(want - len(kept), step), queue=False)
                    groups = self.pipeline.collect(pending)
            with timer("score"):  # streaming: each group was scored as it finished (collected with it)
                got: Scored = self.pipeline.score(pending, groups)
            m.update(got.metrics)
            self.env_watch.observe(got.groups)
            scores = got.scores
            seen += len(got.groups)
            for k, v in scores.errors.items():
                errors[k] = errors.get(k, 0) + v
            self.watch.observe(scores)
            filtering = cfg.algo.dynamic_sampling and rounds < cfg.algo.max_sampling_rounds
            for i, g in enumerate(got.groups):
                part = slice(i * G, (i + 1) * G)
                if filtering and zero_spread(scores.total[part]):
                    continue
                kept.append(g)
                totals.extend(scores.total[part])
                for k, v in scores.per_function.items():
                    per_fn.setdefault(k, []).extend(v[part])
            if len(kept) >= want or not cfg.algo.dynamic_sampling:
                break
            rounds += 1
        m.update({"rollout/sampling_rounds": float(rounds), "rollout/pass_rate": len(kept) / max(1, seen)})
        m.update(self.env_watch.end_step())  # first: an environment that raises fails its rewards too
        m.update(self.watch.end_step())
        return kept, RewardResult(total=totals, per_function=per_fn, errors=errors), m

    def submit_ahead(self, step: int) -> None:
        """While the learner trains on ``step``: queue the batches of steps up to ``step + depth``
        (not past the last step), generated with the weights the engines hold now."""
        q, last = self.pipeline.queue, min(self.cfg.trainer.steps, step + self.depth)
        for s in range(q[-1].step + 1 if q else step + 1, last + 1):
            before = self.stream.state_dict()
            self.pipeline.submit(s, *self.draw(self.cfg.rollout.prompts_per_step, s), data_before=before)

    def draw(self, n: int, step: int) -> tuple[list, list]:
        """The next ``n`` prompts for (1-based) ``step`` and their sampling-seed keys (trainer
        seed, step, position in the prompt stream): their completions depend on nothing else,
        not on the workers, a replacement or a resume (grpo_dist/rollout/seeds.py)."""
        s = self.stream.state_dict()
        start = s["epoch"] * s["num_records"] + s["index"]
        return self.stream.next_batch(n), [(self.cfg.trainer.seed, step, start + i) for i in range(n)]

    def data_state(self) -> dict[str, Any]:
        """Where a resumed run continues: before every prompt generated but not yet trained on."""
        return self.pipeline.data_before() or self.stream.state_dict()

    def on_version(self, version: int) -> None:
        """The loads of ``version`` were just sent to every engine."""
        self.pipeline.on_version(version)
