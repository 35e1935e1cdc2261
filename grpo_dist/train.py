"""The driver: GRPO, one step per iteration.

Generate G completions per prompt and score them (or take the batch generated ahead), turn the
rewards into advantages, queue the next batches, let the learner update, push the new weights to
the engines. Strictly on-policy by default; with ``trainer.max_staleness`` k >= 1 the batches of
the next steps are generated (with the weights of their start) while the learner trains, and no
sample is more than k versions older than the learner.

Everything else lives below: the run's lifecycle and cadence in ``run/``, batch or streaming
generation in ``orchestrator/manager.py``, the weight sync in ``sync/``, the math in ``algo/``.
"""

from __future__ import annotations

from typing import Any

from grpo_dist.batch import build_batch, staleness_metrics, token_version_metrics
from grpo_dist.reward.answer_form import form_metrics
from grpo_dist.run.monitor import StepTimer
from grpo_dist.run.run import Interrupted, Run, TrainingError
from grpo_dist.types import TrainBatch


def train(run: Run) -> dict[str, Any]:
    """Train for ``trainer.steps`` steps on ``run`` (started here if it is not); the summary."""
    cfg = run.start()  # workers up, resumed, evaluated before training
    with run.stopping():  # a failing reward or a lost actor: one line, where to resume
        while run.step < cfg.trainer.steps and not run.stop_requested and not run.out_of_time():
            one_step(run)
        if run.stop_requested:  # Ctrl-C / SIGTERM: the step finished, a checkpoint, then Interrupted
            run.interrupted()
        return run.finish()


def one_step(run: Run) -> None:
    """Step ``run.step + 1``: generate and score, shape, queue ahead, learn, sync, close the step."""
    rollouts, sync = run.rollouts, run.sync
    step, t = run.step + 1, StepTimer()
    groups, scores, m = rollouts.scored_batch(step, t)  # generated now, or ahead while the learner trained
    batch = shape(groups, scores, run, m, learner_version=sync.version)  # advantages; staleness checked
    rollouts.submit_ahead(step)  # the next steps' batches generate with the current weights
    m.update(learn(run, batch, step, t))  # the policy update (and the reference refresh)
    run.learned = step  # the learner is past the last checkpointable step until end_step
    with t("sync"):  # version v+1 to every engine; awaited only when nothing runs ahead
        m.update(sync.push(int(m["train/version"]), wait=rollouts.depth == 0))
    run.end_step(t, m, groups, scores, batch)  # log, evaluate, checkpoint


def train_adapters(runs: dict[str, Run]) -> tuple[dict[str, dict[str, Any]], dict[str, str]]:
    """Several adapters on one fleet (``run/fleet.py``): each started (evaluated before training),
    then a step of each live adapter in turn until every one is done. An adapter that stops (its
    reward failing past the limit, its data exhausted, a NaN) stops alone, in one line; the others
    go on, and one that finishes leaves its turns to them. Returns (summaries, failures), by name.
    A stop request (Ctrl-C) ends every adapter after its current step, each with a checkpoint."""
    summaries: dict[str, dict[str, Any]] = {}
    failed: dict[str, str] = {}
    live: dict[str, Run] = {}
    for name, run in runs.items():
        try:
            run.start()
            live[name] = run
        except TrainingError as e:
            failed[name] = _stopped(name, e)
    while live:
        for name, run in list(live.items()):
            try:
                with run.stopping():
                    if run.step < run.cfg.trainer.steps and not run.stop_requested and not run.out_of_time():
                        one_step(run)
                        continue
                    if run.stop_requested:
                        run.interrupted()
                    summaries[name] = run.finish()
            except (TrainingError, Interrupted) as e:  # (interrupted: its checkpoint saved; the others save theirs)
                failed[name] = _stopped(name, e)
            del live[name]
    return summaries, failed


def _stopped(name: str, e: Exception) -> str:
    print(f"adapter {name} stopped: {e}", flush=True)
    return str(e)


def shape(groups, scores, run: Run, metrics: dict[str, float], learner_version: int) -> TrainBatch:
    """The learner's batch (rewards shaped, advantages per sequence); every sample at most
    ``trainer.max_staleness`` versions behind the learner that trains on it."""
    cfg = run.cfg
    budget, all_tokens = cfg.rollout.overlong_budget
    batch, m = build_batch(groups, scores, cfg.rollout.group_size, cfg.algo, budget, all_tokens)
    metrics.update(m)  # with a math reward, the shares of the answers' forms (its hacks show there)
    metrics.update(form_metrics(cfg.reward.functions, (r.completion for g in groups for r in g.rollouts)))
    try:
        metrics.update(staleness_metrics(batch.adapter_versions, learner_version, cfg.trainer.max_staleness))
        metrics.update(token_version_metrics(groups, learner_version))  # the oldest token bounds the above
    except ValueError as e:
        raise TrainingError(f"step {run.step + 1}: {e}") from None
    return batch


def learn(run: Run, batch: TrainBatch, step: int, t: StepTimer) -> dict[str, float]:
    """One update on every learner rank (each its shard of the batch). Colocated on GPU the engines
    sleep first (the sync wakes them). Every ``algo.ref_refresh_every`` steps the KL reference
    moves toward the policy."""
    w, every = run.workers, run.cfg.algo.ref_refresh_every
    if run.sleeps:
        with t("rollout_sleep"):
            w.rollout.get(w.rollout.call("sleep"))
    with t("learn"):
        k = len(w.learner)
        stats = w.learner.get(w.learner.call_each("train_step", [(batch.shard(r, k),) for r in range(k)]))[0]
    run.check_finite(stats, "the learner (nothing was synced)")
    if every and step % every == 0:
        with t("ref_refresh"):
            stats.update(w.learner.get(w.learner.call("refresh_reference"))[0])
    return stats
