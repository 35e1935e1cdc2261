"""A run on the driver: its lifecycle (start, resume, close), its cadence (evaluation, logging,
checkpoints) and its reporting (history, summary). The algorithm itself is ``grpo_dist.train``.

``Run(cfg)`` resolves the outputs (absolute ``output_dir``, run id, ``config.yaml``);
:meth:`Run.start` checks the inputs (pre-flight, cached: the CLI already ran it), starts Ray and
the three actor groups, wires the weight sync, the rollout manager and dead-actor recovery,
resumes from a checkpoint and evaluates before training (or reuses a recorded evaluation of the
same base model: ``eval_cache.py``); :meth:`Run.end_step` closes a step;
:meth:`Run.finish` evaluates after training, saves, writes ``summary.json``.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

from grpo_dist.cluster import ray_utils
from grpo_dist.cluster.ray_utils import init_ray
from grpo_dist.cluster.recovery import Recovery
from grpo_dist.cluster.shared_dir import check_storage
from grpo_dist.config import Config
from grpo_dist.data import PromptStream
from grpo_dist.devices import choices, sleeps_while_learning
from grpo_dist.reward.failures import RewardFailureError
from grpo_dist.run.monitor.tables import sample_table
from grpo_dist.orchestrator.manager import RolloutManager
from grpo_dist.run import checkpoint, preflight
from grpo_dist.run.budget import TimeBudget
from grpo_dist.run.eval_cache import base_evaluation, without_samples
from grpo_dist.run.evaluation import eval_metrics, evaluate_sets, headline
from grpo_dist.run.monitor import Monitor, StepTimer
from grpo_dist.run.monitor.wandb_logger import wandb_segments
from grpo_dist.run.inputs import resolve_inputs
from grpo_dist.run.outputs import (resolve_outputs, resume_command, resume_hint, write_metrics, write_run_files,
                                   write_summary)
from grpo_dist.run.prepare import make_monitor
from grpo_dist.run.stops import Stops, TrainingError
from grpo_dist.run.workers import Workers, start_workers, startup_times
from grpo_dist.sync.factory import make_weight_sync


class Interrupted(RuntimeError):
    """The user stopped the run (SIGINT / SIGTERM); the message says where and how to resume (exit 130)."""


class Run(Stops):
    """``callbacks``: objects with ``on_step(run, step, metrics, groups, batch)``, called at the end
    of every step before its metrics are logged (a callback may add metrics; e.g. a custom
    logger, a profiler or a test's recorder)."""

    def __init__(self, cfg: Config, monitor: Monitor | None = None, callbacks: tuple = (), fleet=None,
                 name: str = ""):
        """``fleet``, ``name``: adapter ``name`` of a run of several (``run/fleet.py``), on its actors."""
        self.fleet, self.name = fleet, name
        self.cfg = cfg = resolve_outputs(resolve_inputs(cfg), write=False)  # absolute paths, run id, the resume checked
        self.out = Path(cfg.output_dir)
        self.monitor, self.callbacks = monitor, list(callbacks)
        self.sleeps = sleeps_while_learning(cfg)  # colocated on GPU: engines sleep while the learner trains
        self.workers: Workers | None = None
        self.step = 0
        self.history: list[dict[str, float]] = []  # per-step metrics since step 1 (kept across resume)
        self.before: dict | None = None  # evaluation before training (kept across resume)
        self.info: dict[str, Any] = {}
        self.startup: dict[str, float] = {}  # startup/*: where this segment's actor start-up went
        self._t0 = time.perf_counter()
        self._wall_before, self._segments = 0.0, 1  # earlier segments of a resumed run (their checkpointed time)
        self._resume_point: dict | None = None  # the prompt stream before the current step's prompts
        self.stop_requested: str | None = None  # a signal's name: stop after the current step
        self._saved_step = -1  # the step of the last checkpoint written
        self._watch_point: dict = {}  # the reward failure and env error counts up to the last finished step
        self._budget = TimeBudget(cfg.trainer.max_minutes)
        self.stopped: str | None = None  # why training ended before trainer.steps (max_minutes)
        self.learned = 0  # the last step the learner trained on (ahead of self.step between learn and end_step)

    # ------------------------------------------------------------------------------- start
    def start(self) -> Config:
        """Workers up, resumed if asked, evaluated before training (idempotent). An output that
        cannot be written (a full or read-only disk) stops it with one TrainingError."""
        if self.workers is not None:
            return self.cfg
        with self.writes():
            return self._start()

    def _start(self) -> Config:
        cfg = self.cfg
        ray_utils.request_stop(False)
        self.out.mkdir(parents=True, exist_ok=True)
        self.train_records, self.eval_records = preflight.prepared_data(cfg)  # cached: checked once per process
        self.extra_records = preflight.extra_eval_sets(cfg)  # eval.extra: more held-out sets
        write_run_files(cfg)  # config.yaml (the resume command's) only once the config is accepted
        stream = PromptStream(self.train_records, seed=cfg.trainer.seed, shuffle=cfg.data.shuffle)
        if self.fleet is not None:  # one adapter of several: the fleet's actors, seen as this adapter
            self._start_in_fleet()
        else:
            self._start_actors()
        w = self.workers
        self.sync = make_weight_sync(cfg)
        self.recovery = self.recovery or Recovery(cfg, w, on_replace=self.sync.on_replace)
        self.sync.setup(w.learner, w.rollout, self.recovery)
        self.rollouts = RolloutManager(cfg, w.rollout, w.reward, self.recovery, stream)
        self.sync.on_push.append(self.rollouts.on_version)
        if cfg.checkpoint.resume:
            self.step, state, path = checkpoint.restore(cfg, w, stream)
            if path is not None:
                print(f"resumed from step {self.step} ({path})", flush=True)
                self._saved_step = self.step  # that checkpoint exists: finishing there rewrites none
                self.history = list(state.get("history", []))
                self.before = state.get("eval_before")
                self._wall_before = float(state.get("wall_seconds", 0.0))
                self._segments = int(state.get("segments", 1)) + 1
                self.rollouts.watch.load_state_dict(state.get("reward_watch", {}))  # the whole run's failure counts
                self.rollouts.env_watch.load_state_dict(state.get("env_watch", {}))  # ... and env errors
            self.sync.restore()  # the engines serve the restored weights
        write_metrics(self.out, self.history, append=False)  # the restored steps (none for a fresh run)
        self._resume_point = self.rollouts.data_state()
        self._watch_point = self._watches()  # the failure counts at that point
        if self.before is None and self.evaluates() and cfg.eval.before:  # a resumed run keeps the original start's
            self.before = without_samples(base_evaluation(  # a recorded one of the same base model, else evaluated
                cfg, self.eval_records, self.extra_records, lambda n: self.evaluate("before training", n),
                "grpo-dist train", say=lambda line: print(line, flush=True)))
            broken = self.before.get("reward_failures", {})
            if broken and cfg.reward.max_failure_rate < 1:  # a reward broken on every eval completion: stop now
                fn, why = next(iter(broken.items()))
                raise TrainingError(f"reward function {fn!r} failed on all {self.before['num_completions']} completions "
                                    f"of the evaluation before training: {why}; nothing was trained: fix the function "
                                    f"and run again")
        self.monitor.start(cfg.trainer.steps)
        return cfg

    def _start_actors(self) -> None:
        cfg = self.cfg
        init_ray(cfg)
        check_storage(cfg)  # cluster.shared_dir seen by every node; full weights on several nodes need it
        self.monitor = self.monitor or make_monitor(cfg)
        for line in start_block(cfg, self.out) + choices(cfg):
            print(line, flush=True)
        t0 = time.perf_counter()
        self.workers, self.info = start_workers(cfg)
        self.startup, line = startup_times(self.info, time.perf_counter() - t0)
        print(line, flush=True)
        self.recovery = None

    def _start_in_fleet(self) -> None:
        fleet = self.fleet
        fleet.start()
        self.monitor = self.monitor or make_monitor(self.cfg, group=fleet.cfg.trainer.run_id, prefix=self.name)
        self.workers, self.info, self.startup = fleet.workers_for(self.name), fleet.info, fleet.startup
        self.recovery = fleet.recovery  # one replacement of a dead actor for every adapter

    # ------------------------------------------------------------------------------- steps
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
        self._watch_point = self._watches()
        if cfg.trainer.eval_every and self.step % cfg.trainer.eval_every == 0 and self.eval_records:
            m.update(eval_metrics(self.evaluate()))
        for cb in self.callbacks:
            cb.on_step(self, self.step, m, groups, batch)
        self.monitor.log(m, self.step)
        self.monitor.check()  # W&B's files: its writer runs in a process of its own
        self.history.append(dict(m, step=float(self.step)))
        write_metrics(self.out, self.history[-1:])
        every = cfg.logging.sample_table_every
        if every and self.step % every == 0:
            self.monitor.log_table(*sample_table(groups, scores, cfg.logging.sample_table_rows), self.step)
        if cfg.checkpoint.every and self.step % cfg.checkpoint.every == 0:
            self.save(self._resume_point)
        return m

    def out_of_time(self) -> bool:
        """``trainer.max_minutes``: True (once, with a line saying so) when the next step would end
        past the budget (``budget.TimeBudget``)."""
        if self._budget.exhausted(self.step, self.cfg.trainer.steps):
            self.stopped = "max_minutes"
            return True
        return False

    # ------------------------------------------------------------------------------- end
    def request_stop(self, why: str) -> None:
        """Stop at the end of the current step (a signal handler calls this: it only sets a flag)."""
        self.stop_requested = why
        ray_utils.request_stop()  # a wait on a silent or stopped actor now gives up in seconds

    def interrupted(self, settle: bool = True, why: str = "") -> None:
        """After a requested stop: every engine settled (not when one hangs: ``settle=False``), a
        checkpoint of the last finished step, then :class:`Interrupted` naming it and the resume command."""
        if settle:
            self.sync.settle(block=True)
        if self.learned > self.step:  # the learner holds an unfinished step's update: no checkpoint of it
            where = f"step {self.learned} trained but not finished, not saved; {resume_hint(self.cfg).split(';')[0]}"
        else:
            if not settle and self.step > 0 and self._saved_step == self.step:  # written at the step's end
                path = checkpoint.step_dir(self.cfg, self.step)
            else:
                path = self.save(self._resume_point) if self.step > 0 else None
            where = f"checkpoint {path}" if path is not None else "no step finished, nothing saved"
        raise Interrupted(f"interrupted ({self.stop_requested}) at step {self.step} ({where}"
                          f"{'; step ' + str(self.step + 1) + ' dropped: ' + why if why else ''}); resume with: "
                          f"{resume_command(self.cfg)}")

    def finish(self) -> dict[str, Any]:
        """Every engine at the final version, evaluation after training, a last checkpoint, the
        final adapter, ``summary.json``."""
        cfg = self.cfg
        self.sync.settle(block=True)
        after = self.evaluate("after training") if self.evaluates() else None
        if self._saved_step != self.step:  # the last step's checkpoint may be written already
            self.save(self._resume_point)
        adapter_dir = checkpoint.save_final(cfg, self.workers.learner, self.out / "adapter")
        self.monitor.check()
        summary = summarize(self, adapter_dir, after)
        watch = self.rollouts.watch
        try:  # no run succeeds in which a reward function failed past reward.max_failure_rate
            self.rollouts.env_watch.check_run()  # ... or its environment / agent raised past rollout.max_env_error_rate
            watch.check_run()
        except RewardFailureError as e:
            where = (f"reward_failures in {self.out / 'summary.json'}" if e.details() else
                     f"rollout/stop_reason/env_error in {self.out / 'metrics.jsonl'}")
            raise TrainingError(f"the run finished ({self.step} steps, adapter in {adapter_dir}), but {e}: see "
                                f"{where}") from None
        return summary

    def save(self, data_state: dict | None) -> Path:
        path = checkpoint.save(self.cfg, self.workers, self.step, data_state or self.rollouts.data_state(),
                               {"history": self.history, "eval_before": self.before, **self._watch_point,
                                "wall_seconds": self.wall_seconds(), "segments": self._segments})
        print(f"checkpoint saved: {path}", flush=True)
        self._saved_step = self.step
        return path

    def _watches(self) -> dict[str, dict]:
        """What a checkpoint keeps of the failure watches (their counts: ``reward/failures.py``,
        ``orchestrator/env_errors.py``)."""
        return {"reward_watch": self.rollouts.watch.state_dict(), "env_watch": self.rollouts.env_watch.state_dict()}

    def evaluates(self) -> bool:
        """Held-out evaluation after training (and before it, unless ``eval.before`` is false)."""
        return bool(self.cfg.trainer.eval_before_after and self.eval_records)

    def wall_seconds(self) -> float:
        """The run's wall time: this segment's, plus the earlier segments' up to their last checkpoint."""
        return self._wall_before + time.perf_counter() - self._t0

    def evaluate(self, when: str | None = None, with_samples: int = 0) -> dict[str, Any]:
        """The held-out evaluation of the weights the engines serve; ``when`` says so on the console;
        ``with_samples``: the report keeps that many prompts' completions."""
        if when:
            more = "".join(f" + {len(v)} {k}" for k, v in self.extra_records.items())  # eval.extra sets
            print(f"evaluating {len(self.eval_records)} held-out prompts{more} {when} ...", flush=True)
        t0 = time.perf_counter()
        report = evaluate_sets(self.cfg, self.workers.rollout, self.workers.reward, self.eval_records,
                               self.extra_records, with_samples=with_samples,
                               progress=(lambda line: print(line, flush=True)) if when else None)
        if when:
            more = "".join(f"; {k}: {headline(v)}" for k, v in report.get("extra", {}).items())
            print(f"evaluated {when} in {time.perf_counter() - t0:.0f} s: {headline(report)}{more}", flush=True)
        return report

    def close(self) -> None:
        if self.monitor is not None:
            try:  # (W&B's last records on a full disk: the run has said what failed already)
                self.monitor.close()
            except Exception as e:  # pragma: no cover - shutting down anyway
                print(f"warning: closing the monitors: {e.__class__.__name__}: {e}", file=sys.stderr, flush=True)
        if self.workers is not None and self.fleet is not None:  # the fleet's actors: the fleet closes them
            self.workers = None
        if self.workers is not None:
            self.workers.close(quick=bool(self.stop_requested))
            self.workers = None


def summarize(run: Run, adapter_dir: Path, after: dict[str, Any] | None) -> dict[str, Any]:
    """``summary.json`` of a finished run, and its summary in the monitor (W&B)."""
    metrics = {k: v for k, v in (run.history[-1] if run.history else {}).items() if k != "step"}
    hosts = run.workers.hosts()
    summary = write_summary(run.out, run.step, run.wall_seconds(), adapter_dir,
                            getattr(run.monitor, "wandb_dir", None), metrics, run.history, run.before, after,
                            reward_failures=run.rollouts.watch.report(),
                            extra={"wall_seconds_this_segment": time.perf_counter() - run._t0,
                                   "segments": run._segments, "peak_rss_gib": run.workers.peak_rss_gib(),
                                   "hosts": hosts, "startup": run.startup,
                                   **({"stopped": run.stopped} if run.stopped else {}),
                                   **wandb_segments(run.cfg)})
    sets = {f"eval/{name}/{k}": v for name, one in summary.get("eval_sets", {}).items() for k, v in one.items()
            if isinstance(v, (int, float))}  # eval.extra: eval/<set>/sampled_accuracy_before, ...
    run.monitor.summary({**{k: v for k, v in summary.items() if not isinstance(v, dict)}, **sets,
                         **{f"hosts/{role}": " ".join(ips) for role, ips in hosts.items()}})
    return summary


def start_block(cfg: Config, out: Path) -> list[str]:
    """What is being started, where the outputs go (the first lines a user reads)."""
    c, r = cfg, cfg.rollout
    where = f"Ray cluster at {c.cluster.address}" if c.cluster.address else \
        f"local Ray cluster ({c.cluster.num_cpus or 'all'} CPUs)"
    return [f"run       {out} (run id {c.trainer.run_id})",
            f"model     {c.model.path} ({'LoRA r=' + str(c.lora.r) if c.lora.enabled else 'full weights'}, "
            f"{c.model.dtype})",
            f"cluster   {where}, layout {c.cluster.layout}",
            f"starting  {r.num_workers} {r.backend} rollout engine(s), {c.reward.num_workers} reward actor(s), "
            f"{c.learner.num_learners} learner rank(s); {c.trainer.steps} steps of "
            f"{r.prompts_per_step} prompts x {r.group_size}",
            f"logs      {out / 'workers.log'} (what the actors print: vLLM, Ray, DeepSpeed)" if not
            c.logging.verbose else "logs      on the console (--verbose)"]
