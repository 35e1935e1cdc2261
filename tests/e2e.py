"""Shared helpers of the end-to-end tests (``import e2e``): the short-run config, a recording
callback, running and extending a run through the real driver (``grpo_dist.train.train``).

The Ray fixture (``ray_cluster``) lives in conftest.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from grpo_dist.config import Config, load_config

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "configs" / "tiny_cpu.yaml"


def overrides(model_dir, out, *, workers: int = 1, steps: int = 2, **sections: dict) -> dict[str, Any]:
    """A short run on the demo config: the hf rollout backend (no vLLM start-up), 4 prompts x 4
    completions of 5 tokens, no evaluation, no checkpoints, W&B off. ``sections`` update it."""
    base: dict[str, Any] = {
        "output_dir": str(out), "model": {"path": str(model_dir), "make_if_missing": None},
        "rollout": {"backend": "hf", "num_workers": workers, "prompts_per_step": 4, "group_size": 4, "max_tokens": 5},
        "learner": {"micro_batch_size": 8}, "trainer": {"steps": steps, "eval_before_after": False},
        "checkpoint": {"every": 0}, "logging": {"wandb_mode": "disabled", "progress": False},
    }
    for k, v in sections.items():
        if isinstance(v, dict):
            base.setdefault(k, {}).update(v)
        else:
            base[k] = v
    return base


def config(model_dir, out, **kw) -> Config:
    return load_config(DEMO, overrides(model_dir, out, **kw))


class Recorder:
    """A run callback keeping, per step: the learner version the batch was trained at (the sync's
    version before the step's push), each sample's version, the completion ids, behaviour
    log-probs and prompt ids of the batch, and the batch itself. ``before_step(run, step)`` runs
    before each step after the first (fault injection)."""

    def __init__(self, before_step: Callable[[Any, int], None] | None = None):
        self.steps: list[dict[str, Any]] = []
        self.before_step = before_step

    def on_step(self, run, step, metrics, groups, batch) -> None:
        self.steps.append({"learner_version": int(metrics["sync/version"]) - run.cfg.algo.num_iterations,
                           "versions": list(batch.adapter_versions), "completion_ids": batch.completion_ids,
                           "logprobs": batch.behaviour_logprobs, "prompt_ids": [g.prompt_id for g in groups],
                           "batch": batch})
        if self.before_step is not None and step < run.cfg.trainer.steps:
            self.before_step(run, step + 1)

    @property
    def prompt_ids(self) -> list[int]:
        """Every prompt whose group entered a learner batch, in order."""
        return [i for s in self.steps for i in s["prompt_ids"]]

    @property
    def last_batch(self):
        return self.steps[-1]["batch"]


def start(cfg: Config, recorder: Recorder | None = None):
    """A started Run (workers up) whose callbacks include ``recorder``."""
    from grpo_dist.run.run import Run

    run = Run(cfg, callbacks=(recorder,) if recorder is not None else ())
    run.start()
    return run


def train_run(cfg: Config, recorder: Recorder | None = None, keep: bool = False):
    """Run ``cfg`` to the end through the driver; returns (run, summary). The run is closed
    unless ``keep`` (then the caller closes it)."""
    from grpo_dist.train import train

    run = start(cfg, recorder)
    try:
        summary = train(run)
    except BaseException:
        run.close()
        raise
    if not keep:
        run.close()
    return run, summary


def more_steps(run, n: int = 1) -> dict[str, float]:
    """``n`` more steps of a run that finished (through the driver); the last step's metrics."""
    from grpo_dist.train import train

    run.cfg.trainer.steps = run.step + n
    train(run)
    return run.history[-1]


def engine_processes(actor, title: str, timeout: float = 300) -> list:
    """The live processes below a rollout actor's process whose title starts with ``title``: the
    engine outside the actor's process (``rollout.engine_in_process`` false, every streaming
    engine) is vLLM's ``VLLM::EngineCore`` and, on CPU, its ``VLLM::Worker``. The actor's pid comes
    from its heartbeat, which answers while the actor works (and once a new actor is constructed)."""
    import psutil
    import ray

    pid = ray.get(actor.heartbeat.remote(), timeout=timeout)["pid"]
    found = []
    try:
        children = psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return found
    for p in children:
        try:
            if " ".join(p.cmdline()).startswith(title) and p.status() != psutil.STATUS_ZOMBIE:
                found.append(p)
        except psutil.NoSuchProcess:
            continue
    return found


def hf_logprob_diff(model, rollouts) -> float:
    """The largest |engine log-prob - Hugging Face's| over the sampled tokens of ``rollouts``, with
    ``model``'s weights in float32 (a model directory, or a model already loaded): near 0 when the
    engine serves those weights."""
    import torch
    from transformers import AutoModelForCausalLM

    hf = model if isinstance(model, torch.nn.Module) else \
        AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32).eval()
    d = 0.0
    with torch.no_grad():
        for r in rollouts:
            ids = torch.tensor([r.prompt_ids + r.completion_ids])
            logp = torch.log_softmax(hf(ids).logits[0, :-1].float(), -1)
            n = len(r.prompt_ids)
            ref = logp[n - 1:].gather(-1, ids[0, n:, None])[:, 0].tolist()
            d = max([d] + [abs(a - b) for a, b in zip(r.logprobs, ref)])
    return d
