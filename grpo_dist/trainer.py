"""The driver: generate -> score -> advantages -> learn -> sync.

Strictly on-policy by default. With ``trainer.max_staleness`` k >= 1 the batches of the next
steps are generated (with the weights of their start) while the learner trains on this one: no
sample is more than k versions older than the learner, which takes the rollout engine's
log-probs as pi_old in the ratio (``grpo_dist.cluster.pipeline``; ``async_rollouts`` = one step ahead).

Reads like the algorithm; everything else lives in ``batch`` (pure shaping/advantages),
``cluster`` (Ray), ``evaluation``, ``checkpoint`` and ``monitor``.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

from grpo_dist import checkpoint, preflight
from grpo_dist.batch import SAMPLE_COLUMNS, build_batch, sample_rows, staleness_metrics, zero_spread
from grpo_dist.cluster import dispatch
from grpo_dist.cluster.actors import Workers, start_workers
from grpo_dist.cluster.recovery import Recovery
from grpo_dist.cluster.ray_utils import ClusterError, init_ray
from grpo_dist.cluster.shared_dir import check_storage
from grpo_dist.outputs import resolve_outputs, resume_command, resume_hint, write_summary
from grpo_dist.config import Config
from grpo_dist.data import PromptStream
from grpo_dist.devices import choices
from grpo_dist.cluster.pipeline import RolloutPipeline
from grpo_dist.cluster.stream import StreamPipeline
from grpo_dist.rollout.worker import sleeps_while_learning
from grpo_dist.evaluation import eval_metrics, evaluate
from grpo_dist.monitor import Monitor, StepTimer, non_finite, sync_clocks
from grpo_dist.reward.failures import FailureWatch, RewardFailureError
from grpo_dist.types import RewardResult
from grpo_dist.setup_run import make_monitor

log = logging.getLogger("grpo_dist.trainer")


class TrainingError(RuntimeError):
    pass


class Trainer:
    def __init__(self, cfg: Config, monitor: Monitor | None = None):
        self.cfg = cfg = resolve_outputs(cfg)  # absolute output_dir on this node, run id
        self._sleeps = sleeps_while_learning(cfg)
        self.out = Path(cfg.output_dir)
        self.trained_prompt_ids: list[int] = []  # every group that entered a learner batch, in order
        self.monitor = monitor
        self.workers: Workers | None = None
        self.step = 0
        self.history: list[dict[str, float]] = []  # per-step metrics since step 1 (kept across resume)
        self._before: dict | None = None  # evaluation before training (kept across resume)
        self.version = 0  # the learner's adapter version, loaded (or queued) on every rollout worker
        self.depth = cfg.trainer.max_staleness // cfg.algo.num_iterations  # steps generation runs ahead
        self.reward_watch = FailureWatch(cfg.reward)  # stops a run whose reward function keeps failing

    # ---------------------------------------------------------------- set-up
    def setup(self) -> dict[str, Any]:
        cfg = self.cfg
        self.out.mkdir(parents=True, exist_ok=True)
        self.train_records, self.eval_records = preflight.prepared_data(cfg)  # model, rewards, data checked
        self.stream = PromptStream(self.train_records, seed=cfg.trainer.seed, shuffle=cfg.data.shuffle)
        init_ray(cfg)
        check_storage(cfg)  # cluster.shared_dir seen by every node; full weights on several nodes need it
        self.monitor = self.monitor or make_monitor(cfg)
        for line in choices(cfg):
            print(line, flush=True)
        self.workers, info = start_workers(cfg)
        self.recovery = Recovery(cfg, self.workers, lambda: self._export() if self.version > 0 else None)
        if cfg.rollout.streaming:  # one request per group, each scored as soon as it is generated
            self.pipeline = StreamPipeline(self.workers.rollout, self.workers.reward, self.recovery,
                                           cfg.rollout.generate_timeout_s, cfg.rollout.prompts_per_step * (self.depth + 1))
        else:
            self.pipeline = RolloutPipeline(self.workers.rollout, self.recovery, cfg.rollout.generate_timeout_s,
                                            chunk=cfg.trainer.dispatch_chunk)
        if cfg.checkpoint.resume:
            self.step, run_state, path = checkpoint.restore(cfg, self.workers, self.stream)
            if path is not None:
                print(f"resumed from step {self.step} ({path})", flush=True)
                self.history = list(run_state.get("history", []))
                self._before = run_state.get("eval_before")
            self.sync()
        return info

    # ---------------------------------------------------------------- one step
    def collect(self, t: "StepTimer") -> tuple[list, RewardResult, dict[str, float]]:
        """Generate (or take the batch generated ahead for this step) and score; with dynamic
        sampling, drop zero-spread groups and refill (bounded)."""
        cfg, w, G = self.cfg, self.workers, self.cfg.rollout.group_size
        want = cfg.rollout.prompts_per_step
        kept: list = []
        totals: list[float] = []
        per_fn: dict[str, list[float]] = {}
        errors: dict[str, int] = {}
        rounds = seen = 0
        while True:
            ahead = self.pipeline.take(self.step + 1) if rounds == 0 else None
            if ahead is not None:
                with t("generate_wait"):  # what the learner's update did not hide
                    groups = self.pipeline.collect(ahead)
            else:
                with t("generate"):
                    groups = self.pipeline.generate(self.step + 1, *self._draw(want - len(kept), self.step + 1))
            with t("score"):  # streaming: scored as each group finished
                scores = (self.pipeline.score(groups) if cfg.rollout.streaming
                          else self.recovery.run(dispatch.score, w.reward, groups))
            seen += len(groups)
            for k, v in scores.errors.items():
                errors[k] = errors.get(k, 0) + v
            self.reward_watch.observe(len(scores.total), scores.errors, scores.tracebacks)
            filtering = cfg.algo.dynamic_sampling and rounds < cfg.algo.max_sampling_rounds
            for i, g in enumerate(groups):
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
        merged = RewardResult(total=totals, per_function=per_fn, errors=errors)
        m = {"rollout/sampling_rounds": float(rounds), "rollout/pass_rate": len(kept) / max(1, seen)}
        m.update(self.reward_watch.end_step())  # raises RewardFailureError past reward.max_failure_rate
        return kept, merged, m

    def sync(self) -> dict[str, float]:
        """Learner rank 0 exports version v+1; every rollout worker loads it (and this waits)."""
        w = self.workers
        update = self._export()
        # a worker that died since generating is replaced (and given this update) and the load re-issued
        results = self.recovery.run(lambda: w.rollout.get(w.rollout.call("load_update", update)))
        versions = {r["version"] for r in results}
        if len(versions) != 1:
            raise TrainingError(f"rollout workers disagree on the adapter version: {sorted(versions)}")
        self.version = next(iter(versions))
        return {"sync/bytes": float(results[0]["bytes"]), "sync/seconds": max(r["seconds"] for r in results),
                "sync/version": float(versions.pop()), **sync_clocks(results)}

    def _export(self):
        """A Ray ref to the learner's current weights as the transport carries them. Called on
        every rank (ZeRO-3 gathers the partitions: a collective); rank 0's result is the payload."""
        return self.workers.learner.call("publish_update")[0]

    def train_step(self) -> dict[str, float]:
        cfg, w, t = self.cfg, self.workers, StepTimer()
        groups, scores, m = self.collect(t)
        self.trained_prompt_ids.extend(g.prompt_id for g in groups)
        batch, rollout_m = build_batch(groups, scores, cfg.rollout.group_size, cfg.algo, cfg.rollout.max_tokens)
        m.update(rollout_m)
        try:  # every sample at most max_staleness versions behind the learner that trains on it
            m.update(staleness_metrics(batch.adapter_versions, self.version, cfg.trainer.max_staleness))
        except ValueError as e:
            raise TrainingError(f"step {self.step + 1}: {e}") from None
        self._submit_ahead()  # the next steps' batches generate (current weights) while the learner trains
        if self._sleeps:  # colocated on GPU: engines free their memory; the sync wakes them
            with t("rollout_sleep"):
                w.rollout.get(w.rollout.call("sleep"))
        with t("learn"):
            k = len(w.learner)
            stats = w.learner.get(w.learner.call_each("train_step", [(batch.shard(r, k),) for r in range(k)]))
        m.update(stats[0])
        self._check_finite(stats[0], "the learner (nothing was synced)")
        every = cfg.algo.ref_refresh_every
        if every and (self.step + 1) % every == 0:  # the KL reference <- mix of policy and reference
            with t("ref_refresh"):
                m.update(w.learner.get(w.learner.call("refresh_reference"))[0])
        with t("sync"):
            sync_m = self.sync() if self.depth == 0 else self._sync_ahead(int(stats[0]["train/version"]))
        m.update(sync_m)
        m.update(t.metrics())
        m["cluster/restarts"] = float(self.recovery.restarts)
        tokens = sum(len(c) for c in batch.completion_ids)
        m["perf/tokens_per_s"] = tokens / max(1e-9, m["timing/step"])
        self._check_finite(m, "this step")
        self._last_samples, self.last_batch = (groups, scores), batch
        return m

    def _submit_ahead(self) -> None:
        """Queue the batches of steps up to ``step + 1 + depth`` (not past the last step)."""
        q, last = self.pipeline.queue, min(self.cfg.trainer.steps, self.step + 1 + self.depth)
        nxt = q[-1].step + 1 if q else self.step + 2
        for s in range(nxt, last + 1):
            before = self.stream.state_dict()
            self.pipeline.submit(s, *self._draw(self.cfg.rollout.prompts_per_step, s), data_before=before)

    def _sync_ahead(self, version: int) -> dict[str, float]:
        """Pipelined sync: the engines load ``version`` after the generations queued on them (not
        awaited: the batches submitted from now on use it); reports the loads answered so far."""
        self.pipeline.load(self._export(), version)
        self.version = version
        done = self.pipeline.settle_loads()
        m = {"sync/version": float(version)}
        if done:
            m.update({"sync/bytes": float(done[-1]["bytes"]), "sync/seconds": max(r["seconds"] for r in done),
                      **sync_clocks(done)})
        return m

    def _draw(self, n: int, step: int) -> tuple[list, list]:
        """The next ``n`` prompts for (1-based) ``step`` and their sampling-seed keys (trainer
        seed, step, position in the prompt stream): their completions depend on nothing else,
        not on the workers, a replacement or a resume (grpo_dist/rollout/seeds.py)."""
        s = self.stream.state_dict()
        start = s["epoch"] * s["num_records"] + s["index"]
        return self.stream.next_batch(n), [(self.cfg.trainer.seed, step, start + i) for i in range(n)]

    def _data_state(self) -> dict:
        """Where a resumed run continues: before every prompt generated but not yet trained on."""
        return self.pipeline.data_before() or self.stream.state_dict()

    def _check_finite(self, metrics: dict[str, float], where: str) -> None:
        bad = non_finite(metrics)
        if bad:
            raise TrainingError(f"step {self.step + 1}: non-finite metrics from {where}: {bad}; stopping: "
                                f"{resume_hint(self.cfg)}")

    # ---------------------------------------------------------------- the run
    def run(self) -> dict[str, Any]:
        cfg, t0 = self.cfg, time.perf_counter()
        if self.workers is None:
            self.setup()
        if self._before is None and cfg.trainer.eval_before_after and self.eval_records:
            self._before = self.evaluate()  # a resumed run keeps the original start's evaluation
        before = self._before
        self.monitor.start(cfg.trainer.steps)
        metrics: dict[str, float] = {}
        try:
            metrics = self._loop()
            self.pipeline.settle_loads(block=True)  # every engine at the final version
            after = self.evaluate() if before is not None else None
            self._save(self._data_state())
            adapter_dir = checkpoint.save_final(cfg, self.workers.learner, self.out / "adapter")
        except ClusterError as e:  # past recovery (a learner rank lost, restarts used up): say how to go on
            raise TrainingError(f"{e}; stopped at step {self.step}: {resume_hint(cfg)}") from e
        return self.finish(before, after, metrics, adapter_dir, time.perf_counter() - t0)

    def _save(self, data_state: dict):
        return checkpoint.save(self.cfg, self.workers, self.step, data_state,
                               {"history": self.history, "eval_before": self._before})

    def _loop(self) -> dict[str, float]:
        cfg, metrics = self.cfg, {}
        while self.step < cfg.trainer.steps:
            start = self._data_state()  # the stream before this step's prompts
            try:
                metrics = self.train_step()
            except RewardFailureError as e:  # checkpoint what was learned so far, then stop
                path = self._save(start)
                raise TrainingError(f"step {self.step + 1}: {e}; stopped with a checkpoint of step {self.step} in "
                                    f"{path}; fix the function, then resume with: {resume_command(cfg)}\n"
                                    f"{e.details()}") from None
            self.step += 1
            if cfg.trainer.eval_every and self.step % cfg.trainer.eval_every == 0 and self.eval_records:
                metrics.update(eval_metrics(self.evaluate()))
            self.monitor.log(metrics, self.step)
            self.history.append(dict(metrics, step=float(self.step)))
            every = cfg.logging.sample_table_every
            if every and self.step % every == 0:
                self.monitor.log_table("samples", SAMPLE_COLUMNS, sample_rows(*self._last_samples,
                                       cfg.logging.sample_table_rows), self.step)
            if cfg.checkpoint.every and self.step % cfg.checkpoint.every == 0:
                self._save(self._data_state())
        return metrics

    def evaluate(self) -> dict[str, Any]:
        return evaluate(self.cfg, self.workers.rollout, self.workers.reward, self.eval_records)

    def finish(self, before, after, metrics, adapter_dir, wall) -> dict[str, Any]:
        summary = write_summary(self.out, self.step, wall, adapter_dir, getattr(self.monitor, "wandb_dir", None),
                                metrics, self.history, before, after)
        self.monitor.summary({k: v for k, v in summary.items() if not isinstance(v, dict)})
        return summary

    def close(self) -> None:
        if self.monitor is not None:
            self.monitor.close()
        if self.workers is not None:
            rollout = self.workers.rollout
            try:  # engines release their processes and adapter dirs
                rollout.get(rollout.call("close"), timeout=60)
            except Exception:  # pragma: no cover - shutting down anyway
                pass
            self.workers.kill()
            self.workers = None
