"""Helpers for learner tests and checks (importable by spawned processes and Ray actors, unlike
test modules): test configs and batches, and the functions that look inside or inject faults into a
``Learner`` (passed to a Ray learner actor through its one hook, ``debug_call``).

Nothing here is used in training, and importing it binds no port and starts nothing.
"""

from __future__ import annotations

import contextlib
import functools
import random
from typing import Any, Iterator, Optional

import torch

from grpo_dist.config import Config, config_from_dict
from grpo_dist.types import TrainBatch


def small_config(model_dir, *, algo=None, learner=None, lora=None, rollout=None, trainer=None,
                 cluster=None, model=None) -> Config:
    """8 sequences per step (2 prompts x G=4), micro-batches of 2, LoRA dropout 0, one torch thread
    (``Learner.setup`` sets the process's threads from ``cluster.torch_threads``), float32 (the
    checks of the learner's math compare against float32/float64 references at tight tolerances;
    ``model.dtype: auto`` would pick bfloat16 on a CPU with AVX512_BF16)."""
    return config_from_dict(dict(
        cluster={"torch_threads": 1, **(cluster or {})},
        model={"path": str(model_dir), "dtype": "float32", **(model or {})},
        lora={"dropout": 0.0, **(lora or {})},
        rollout={"prompts_per_step": 2, "group_size": 4, "max_tokens": 8, **(rollout or {})},
        learner={"micro_batch_size": 2, "lr": 2e-3, **(learner or {})},
        algo=dict(algo or {}),
        trainer={"steps": 10, **(trainer or {})},
    ))


@functools.cache
def in_process_port() -> int:
    """The port of the one world-1 process group every in-process learner of this process uses:
    picked on the first call, once per process (a fixed one collided between two pytest processes
    on the same machine)."""
    from grpo_dist.util.ports import free_port

    return free_port()


def make_learner(cfg: Config):
    """A world-1 learner in this process, set up; returns ``(learner, setup info)``."""
    from grpo_dist.learner import Learner

    learner = Learner(cfg, rank=0, world_size=1, master_port=in_process_port())
    info = learner.setup()
    return learner, info


def random_batch(n: int = 8, seed: int = 0, advantages: Optional[list[float]] = None,
                 vocab: tuple[int, int] = (4, 100)) -> TrainBatch:
    """Ragged prompts (BOS + 2..6 tokens) and completions (1..8 tokens) of random token ids."""
    rng = random.Random(seed)
    prompts = [[1] + [rng.randrange(*vocab) for _ in range(rng.randint(2, 6))] for _ in range(n)]
    comps = [[rng.randrange(*vocab) for _ in range(rng.randint(1, 8))] for _ in range(n)]
    adv = advantages if advantages is not None else [rng.gauss(0.0, 1.0) for _ in range(n)]
    return TrainBatch(prompt_ids=prompts, completion_ids=comps, behaviour_logprobs=[], advantages=list(adv))


def randomize_lora(learner, seed: int = 0, std: float = 0.05) -> None:
    """Set every LoRA B (PEFT starts it at 0) to seeded noise, identical for equal seeds, so every
    LoRA tensor gets a gradient and the policy differs from the reference. ZeRO stage 0 only: the
    float32 master partition of ZeRO-1/2 does not see it (their first update starts from B = 0)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in learner.engine.module.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=g) * std)


def reference_logprobs(learner, batch: TrainBatch) -> list[list[float]]:
    """Per-completion-token log-probs of the learner's KL reference (see ``reference.py``), no grad."""
    mb = learner.layout.collate(batch)
    logp = learner.policy.logprobs_nograd(mb, reference=True).cpu()
    return [logp[r, :n].tolist() for r, n in enumerate(mb.lengths)]


def loss_inputs(learner, batch: TrainBatch) -> dict[str, torch.Tensor]:
    """The tensors the loss sees for the whole batch in one forward (no grad): logp, ref_logp,
    mask, advantages -- for checking train/loss against grpo_dist.algo called directly. Also runs
    inside a Ray learner actor: ``actor.debug_call.remote(loss_inputs, batch)``."""
    mb = learner.layout.collate(batch)
    out = {"logp": learner.policy.logprobs_nograd(mb), "mask": mb.mask, "advantages": mb.advantages}
    if learner.policy.needs_ref():
        out["ref_logp"] = learner.policy.logprobs_nograd(mb, reference=True)
    return out


def set_lr(learner, lr: float) -> None:
    """Fault injection: force the learning rate (e.g. inf) from the next step on
    (``actor.debug_call.remote(set_lr, float("inf"))`` for a Ray learner actor)."""
    for group in learner.engine.optimizer.param_groups:
        group["lr"] = lr
    sched = learner.engine.lr_scheduler
    if sched is not None:
        sched.base_lrs = [lr for _ in sched.base_lrs]


def train_step_with_grads(learner, batch: TrainBatch) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
    """Run ``learner.train_step`` and also return the first update's gradient (after the reduction
    over micro-batches and ranks, before clipping and Adam) as ``{param name: CPU tensor}``.

    Wraps ``engine.step`` for the call: at the first accumulation boundary it copies every
    trainable parameter's full gradient (a collective under ZeRO-3: every rank must call this).
    """
    from deepspeed.utils import safe_get_full_grad

    from grpo_dist.learner.state import cpu_copies, strip_prefixes

    engine, captured = learner.engine, {}
    step = engine.step

    def capturing_step(*args, **kwargs):
        if not captured and engine.is_gradient_accumulation_boundary():
            named = [(n, p) for n, p in engine.module.named_parameters() if p.requires_grad]
            grads = [safe_get_full_grad(p) for _, p in named]
            captured.update(cpu_copies((strip_prefixes(n), g if g is not None else torch.zeros_like(p))
                                       for (n, p), g in zip(named, grads)))
        return step(*args, **kwargs)

    engine.step = capturing_step
    try:
        metrics = learner.train_step(batch)
    finally:
        del engine.step  # back to the class's method
    return captured, metrics


def two_step_grads(learner, batch: TrainBatch, batch2: TrainBatch) -> dict[str, Any]:
    """Randomise LoRA B, then two train steps recording the reduced gradients, metrics and the
    exported tensors after the first update."""
    randomize_lora(learner, seed=3)
    grads1, m1 = train_step_with_grads(learner, batch)
    update = learner.export_update()
    grads2, m2 = train_step_with_grads(learner, batch2)
    return dict(grads1=grads1, m1=m1, grads2=grads2, m2=m2,
                tensors=update.tensors if update is not None else None, version=learner.version)


@contextlib.contextmanager
def spawned_rank(cfg: Config, rank: int, world: int, port: int) -> Iterator[Any]:
    """Inside a ``torch.multiprocessing.spawn`` target: environment, one torch thread, and a set-up
    learner of rank ``rank`` of ``world``, shut down (process group destroyed) on exit."""
    from grpo_dist.util.procenv import setup_env

    setup_env()
    torch.set_num_threads(1)
    from grpo_dist.learner import Learner

    learner = Learner(cfg, rank=rank, world_size=world, master_port=port)
    learner.setup()
    try:
        yield learner
    finally:
        learner.shutdown()


def two_step_rank(rank: int, world: int, port: int, model_dir: str, out_dir: str,
                  batch: TrainBatch, batch2: TrainBatch, algo: Optional[dict] = None,
                  model_dtype: str = "float32", learner: Optional[dict] = None) -> None:
    """``torch.multiprocessing.spawn`` target: one learner rank runs :func:`two_step_grads` on its
    shard and saves the result to ``out_dir/rank{rank}.pt``."""
    cfg = small_config(model_dir, learner=dict(num_learners=world, **(learner or {})),
                       algo=dict(beta=0.04, **(algo or {})), model={"dtype": model_dtype})
    with spawned_rank(cfg, rank, world, port) as learner:
        res = two_step_grads(learner, batch.shard(rank, world), batch2.shard(rank, world))
        torch.save(res, f"{out_dir}/rank{rank}.pt")


def zero3_rank(rank: int, world: int, port: int, model_dir: str, out_dir: str, batch: TrainBatch) -> None:
    """``torch.multiprocessing.spawn`` target: a ZeRO-3 learner rank (parameters partitioned over
    the ranks) trains one step on its shard, refreshes the reference and exports; every rank must
    take part in the export (it gathers). Saves ``out_dir/rank{rank}.pt``."""
    cfg = small_config(model_dir, learner=dict(num_learners=world, zero_stage=3),
                       algo=dict(beta=0.04, ref_refresh_every=1))
    with spawned_rank(cfg, rank, world, port) as learner:
        m = learner.train_step(batch.shard(rank, world))
        learner.refresh_reference(1.0)
        m2 = learner.train_step(batch.shard(rank, world))
        update = learner.export_update()
        torch.save({"m": m, "m2": m2, "tensors": update.tensors if update is not None else None},
                   f"{out_dir}/rank{rank}.pt")


def hang_next_train_step(learner, seconds: float) -> None:
    """Fault injection: the learner's next forward pass (inside its next ``train_step``) stalls
    ``seconds`` first (a hung rank). Patches ``forward`` on the learner's ``PolicyModel``
    instance, where the training step looks it up (Ray dispatches the actor's own methods from
    the class, so patching those on the instance would not reach them)."""
    import time

    policy = learner.policy
    forward = policy.forward

    def stalled(*args, **kwargs):
        del policy.forward  # only this call hangs
        time.sleep(seconds)
        return forward(*args, **kwargs)

    policy.forward = stalled


def adapters_rank(rank: int, world: int, port: int, model_dir: str, out_dir: str, batches: list[TrainBatch],
                  beside: bool) -> None:
    """``torch.multiprocessing.spawn`` target: a ZeRO-2 rank trains adapter "a" on its shards of
    ``batches``, alone or (``beside``) on a learner that also holds adapter "b" and trains it between
    a's steps; saves a's exported tensors to ``out_dir/rank{rank}.pt``."""
    learner_kw = dict(num_learners=world, zero_stage=2)
    a = small_config(model_dir, learner=learner_kw, algo=dict(beta=0.04))
    b = small_config(model_dir, learner=dict(learner_kw, lr=1e-2), lora=dict(r=4, alpha=4), trainer=dict(seed=7))
    from grpo_dist.util.procenv import setup_env

    setup_env()
    torch.set_num_threads(1)
    from grpo_dist.learner import Learner

    learner = Learner(a, rank=rank, world_size=world, master_port=port, adapters={"a": a, "b": b} if beside else None)
    learner.setup()
    try:
        for batch in batches:
            if beside:
                learner.train_step(batch.shard(rank, world), adapter="b")
            learner.train_step(batch.shard(rank, world), adapter="a" if beside else None)
        update = learner.export_update(adapter="a" if beside else None)
        torch.save({"tensors": update.tensors if update is not None else None, "version": learner.version},
                   f"{out_dir}/rank{rank}.pt")
    finally:
        learner.shutdown()
