"""A run on the driver: its lifecycle (start, resume, close), its cadence (evaluation, logging,
checkpoints) and its reporting (history, summary). The algorithm itself is ``grpo_dist.train``.

``Run(cfg)`` resolves the outputs (absolute ``output_dir``, run id, ``config.yaml``);
:meth:`Run.start` checks the inputs (pre-flight, cached: the CLI already ran it), starts Ray and
the three actor groups, wires the weight sync, the rollout manager and dead-actor recovery,
resumes from a checkpoint and evaluates before training; :meth:`Run.end_step` closes a step;
:meth:`Run.finish` evaluates after training, saves, writes ``summary.json``.
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path
from typing import Any, Iterator

from grpo_dist.cluster.ray_utils import ClusterError, init_ray
from grpo_dist.cluster.recovery import Recovery
from grpo_dist.cluster.shared_dir import check_storage
from grpo_dist.config import Config
from grpo_dist.data import PromptStream
from grpo_dist.devices import choices, sleeps_while_learning
from grpo_dist.reward.failures import RewardFailureError
from grpo_dist.batch import SAMPLE_COLUMNS, sample_rows
from grpo_dist.rollout.manager import RolloutManager
from grpo_dist.run import checkpoint, preflight
from grpo_dist.run.evaluation import eval_metrics, evaluate
from grpo_dist.run.monitor import Monitor, StepTimer, non_finite
from grpo_dist.run.outputs import resolve_outputs, resume_command, resume_hint, write_summary
from grpo_dist.run.prepare import make_monitor
from grpo_dist.run.workers import Workers, start_workers
from grpo_dist.sync.collective import make_weight_sync


class TrainingError(RuntimeError):
    """The run stopped: the message says why, where it stopped and how to resume (exit 1)."""


class Run:
    """``callbacks``: objects with ``on_step(run, step, metrics, groups, batch)``, called at the end
    of every step before its metrics are logged (a callback may add metrics; e.g. a custom
    logger, a profiler or a test's recorder)."""

    def __init__(self, cfg: Config, monitor: Monitor | None = None, callbacks: tuple = ()):
        self.cfg = cfg = resolve_outputs(cfg)  # absolute output_dir on this node, run id
        self.out = Path(cfg.output_dir)
        self.monitor, self.callbacks = monitor, list(callbacks)
        self.sleeps = sleeps_while_learning(cfg)  # colocated on GPU: engines sleep while the learner trains
        self.workers: Workers | None = None
        self.step = 0
        self.history: list[dict[str, float]] = []  # per-step metrics since step 1 (kept across resume)
        self.before: dict | None = None  # evaluation before training (kept across resume)
        self.info: dict[str, Any] = {}
        self._t0 = time.perf_counter()
        self._resume_point: dict | None = None  # the prompt stream before the current step's prompts

    # ------------------------------------------------------------------------------- start
    def start(self) -> Config:
        """Workers up, resumed if asked, evaluated before training (idempotent)."""
        if self.workers is not None:
            return self.cfg
        cfg = self.cfg
        self.out.mkdir(parents=True, exist_ok=True)
        self.train_records, self.eval_records = preflight.prepared_data(cfg)  # cached: checked once per process
        stream = PromptStream(self.train_records, seed=cfg.trainer.seed, shuffle=cfg.data.shuffle)
        init_ray(cfg)
        check_storage(cfg)  # cluster.shared_dir seen by every node; full weights on several nodes need it
        self.monitor = self.monitor or make_monitor(cfg)
        for line in choices(cfg):
            print(line, flush=True)
        self.workers, self.info = start_workers(cfg)
        w = self.workers
        self.sync = make_weight_sync(cfg)
        self.recovery = Recovery(cfg, w, on_replace=self.sync.on_replace)
        self.sync.setup(w.learner, w.rollout, self.recovery)
        self.rollouts = RolloutManager(cfg, w.rollout, w.reward, self.recovery, stream)
        self.sync.on_push.append(self.rollouts.on_version)
        if cfg.checkpoint.resume:
            self.step, state, path = checkpoint.restore(cfg, w, stream)
            if path is not None:
                print(f"resumed from step {self.step} ({path})", flush=True)
                self.history = list(state.get("history", []))
                self.before = state.get("eval_before")
            self.sync.restore()  # the engines serve the restored weights
        self._resume_point = self.rollouts.data_state()
        if self.before is None and cfg.trainer.eval_before_after and self.eval_records:
            self.before = self.evaluate()  # a resumed run keeps the original start's evaluation
        self.monitor.start(cfg.trainer.steps)
        return cfg

    # ------------------------------------------------------------------------------- steps
    @contextlib.contextmanager
    def stopping(self) -> Iterator[None]:
        """What ends a run early becomes one TrainingError naming the step and the resume command:
        a reward function failing too often (a checkpoint of the last finished step is saved
        first), or an actor lost past recovery (a learner rank, restarts used up)."""
        try:
            yield
        except RewardFailureError as e:
            path = self.save(self._resume_point)
            raise TrainingError(f"step {self.step + 1}: {e}; stopped with a checkpoint of step {self.step} in "
                                f"{path}; fix the function, then resume with: {resume_command(self.cfg)}\n"
                                f"{e.details()}") from None
        except ClusterError as e:
            raise TrainingError(f"{e}; stopped at step {self.step}: {resume_hint(self.cfg)}") from e

    def check_finite(self, metrics: dict[str, float], where: str) -> None:
        bad = non_finite(metrics)
        if bad:
            raise TrainingError(f"step {self.step + 1}: non-finite metrics from {where}: {bad}; stopping: "
                                f"{resume_hint(self.cfg)}")

    def end_step(self, timer: StepTimer, metrics: dict[str, float], groups: list, scores, batch) -> dict[str, float]:
        """Close step ``self.step + 1``: clocks and throughput, the finite check, then log, evaluate,
        checkpoint as the cadence says."""
        cfg, m = self.cfg, dict(metrics)
        m.update(timer.metrics())
        m["cluster/restarts"] = float(self.recovery.restarts)
        m["perf/tokens_per_s"] = sum(len(c) for c in batch.completion_ids) / max(1e-9, m["timing/step"])
        self.check_finite(m, "this step")
        self.step += 1
        self._resume_point = self.rollouts.data_state()
        if cfg.trainer.eval_every and self.step % cfg.trainer.eval_every == 0 and self.eval_records:
            m.update(eval_metrics(self.evaluate()))
        for cb in self.callbacks:
            cb.on_step(self, self.step, m, groups, batch)
        self.monitor.log(m, self.step)
        self.history.append(dict(m, step=float(self.step)))
        every = cfg.logging.sample_table_every
        if every and self.step % every == 0:
            self.monitor.log_table("samples", SAMPLE_COLUMNS, sample_rows(groups, scores, cfg.logging.sample_table_rows),
                                   self.step)
        if cfg.checkpoint.every and self.step % cfg.checkpoint.every == 0:
            self.save(self._resume_point)
        return m

    # ------------------------------------------------------------------------------- end
    def finish(self) -> dict[str, Any]:
        """Every engine at the final version, evaluation after training, a last checkpoint, the
        final adapter, ``summary.json``."""
        cfg = self.cfg
        self.sync.settle(block=True)
        after = self.evaluate() if self.before is not None else None
        self.save(self._resume_point)
        adapter_dir = checkpoint.save_final(cfg, self.workers.learner, self.out / "adapter")
        metrics = self.history[-1] if self.history else {}
        metrics = {k: v for k, v in metrics.items() if k != "step"}
        summary = write_summary(self.out, self.step, time.perf_counter() - self._t0, adapter_dir,
                                getattr(self.monitor, "wandb_dir", None), metrics, self.history, self.before, after)
        self.monitor.summary({k: v for k, v in summary.items() if not isinstance(v, dict)})
        return summary

    def save(self, data_state: dict | None) -> Path:
        return checkpoint.save(self.cfg, self.workers, self.step, data_state or self.rollouts.data_state(),
                               {"history": self.history, "eval_before": self.before})

    def evaluate(self) -> dict[str, Any]:
        return evaluate(self.cfg, self.workers.rollout, self.workers.reward, self.eval_records)

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

