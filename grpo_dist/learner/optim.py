"""Learning-rate schedule and the DeepSpeed config dict of the learner.

Kept apart from the engine code so both are plain functions, testable without DeepSpeed.
"""

from __future__ import annotations

import math
from typing import Any, Callable

from grpo_dist.config import Config
from grpo_dist.devices import trainable_dtype


def lr_factor(schedule: str, warmup_steps: int, total_steps: int) -> Callable[[int], float]:
    """Multiplier of the peak LR for optimizer step ``s`` (0-based: the ``s``-th update applied).

    Linear warm-up ``(s + 1) / warmup_steps`` for ``s < warmup_steps`` (the first update already
    moves, unlike a warm-up from exactly 0), then ``constant`` (1), ``linear`` (1 -> 0 at the last
    step) or ``cosine`` (half cosine 1 -> 0) over the remaining ``total_steps - warmup_steps``.
    """
    if schedule not in ("constant", "linear", "cosine"):
        raise ValueError(f"unknown lr schedule {schedule!r}")
    warmup_steps = max(0, int(warmup_steps))
    decay_steps = max(1, int(total_steps) - warmup_steps)

    def factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        if schedule == "constant":
            return 1.0
        progress = min(1.0, (step - warmup_steps) / decay_steps)
        if schedule == "linear":
            return 1.0 - progress
        return 0.5 * (1.0 + math.cos(math.pi * progress))

    return factor


def make_scheduler_factory(cfg: Config) -> Callable[[Any], Any]:
    """A callable ``optimizer -> LambdaLR`` for ``deepspeed.initialize(lr_scheduler=...)``.

    Total optimizer steps = ``trainer.steps * algo.num_iterations`` (one update per iteration of
    every training step). DeepSpeed steps the scheduler once per optimizer step.
    """
    import torch

    total = cfg.trainer.steps * cfg.algo.num_iterations
    fn = lr_factor(cfg.learner.lr_schedule, cfg.learner.warmup_steps, total)

    def build(optimizer):
        return torch.optim.lr_scheduler.LambdaLR(optimizer, fn)

    return build


def effective_micro_batch(cfg: Config, world_size: int) -> int:
    """``learner.micro_batch_size``, capped at the per-rank batch."""
    per_rank = cfg.rollout.prompts_per_step * cfg.rollout.group_size // world_size
    return max(1, min(cfg.learner.micro_batch_size, per_rank))


def gradient_accumulation_steps(cfg: Config, world_size: int) -> int:
    """Micro-batches per optimizer step on one rank: ``per_rank_batch // micro_batch_size``.

    The divisibility of the batch by the ranks and of the per-rank batch by the micro-batch is
    checked once, by the config (``Config._cross``, with ``world_size = learner.num_learners``)."""
    per_rank = cfg.rollout.prompts_per_step * cfg.rollout.group_size // world_size
    return per_rank // effective_micro_batch(cfg, world_size)


def deepspeed_config(cfg: Config, world_size: int) -> dict[str, Any]:
    """The DeepSpeed config dict (no fused ops: ``torch_adam`` on CPU)."""
    lc = cfg.learner
    gas = gradient_accumulation_steps(cfg, world_size)
    mb = effective_micro_batch(cfg, world_size)
    ds: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": mb,
        "gradient_accumulation_steps": gas,
        "train_batch_size": mb * gas * world_size,
        "gradient_clipping": float(lc.grad_clip),
        "optimizer": {
            "type": "AdamW",
            "params": {
                "lr": lc.lr,
                "betas": list(lc.betas),
                "eps": 1e-8,
                "weight_decay": lc.weight_decay,
                "torch_adam": bool(lc.torch_adam),
            },
        },
        "zero_optimization": {"stage": lc.zero_stage},
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
    }
    if lc.zero_stage == 3:
        # Keep every parameter gathered-on-demand; small models do not need persistence tuning.
        ds["zero_optimization"].update({"stage3_gather_16bit_weights_on_model_save": True})
    if trainable_dtype(cfg) != cfg.model.dtype:  # float32 adapter on a bf16 base: DeepSpeed's plain fp32 path
        return ds
    if cfg.model.dtype == "bfloat16":
        ds["bf16"] = {"enabled": True}
    elif cfg.model.dtype == "float16":
        ds["fp16"] = {"enabled": True, "initial_scale_power": 16}
    return ds
