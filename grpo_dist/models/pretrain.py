"""Pretraining of the tiny model on a synthetic task with deliberately wrong labels.

Recipe: half the steps on correct labels, then labels correct with probability ``p_correct``
(0.4) and otherwise one too many ("systematic" noise). The model ends knowing the format and the
arithmetic but biased, so that GRPO has something to fix.
"""

from __future__ import annotations

import math
import random
import time
from typing import Any, Callable

import torch

# Pretraining defaults per size: steps, batch size, peak learning rate.
PRETRAIN_DEFAULTS: dict[str, dict[str, float]] = {
    "tiny": dict(steps=2000, batch_size=64, lr=1e-3),
    "small": dict(steps=600, batch_size=64, lr=1e-3),
}


def _encode_batch(tokenizer, prompts: list[str], completions: list[str] | None):
    """Right-padded ``input_ids``, ``attention_mask`` and ``labels`` (loss on completion + EOS only)."""
    eos = tokenizer.eos_token_id
    p_ids = tokenizer(prompts, add_special_tokens=True)["input_ids"]
    c_ids = tokenizer(completions, add_special_tokens=False)["input_ids"] if completions else [[]] * len(p_ids)
    seqs = [p + c + [eos] for p, c in zip(p_ids, c_ids)]
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), tokenizer.pad_token_id, dtype=torch.long)
    mask = torch.zeros_like(ids)
    labels = torch.full_like(ids, -100)
    for i, (p, s) in enumerate(zip(p_ids, seqs)):
        ids[i, : len(s)] = torch.tensor(s)
        mask[i, : len(s)] = 1
        labels[i, len(p): len(s)] = torch.tensor(s[len(p):])
    return ids, mask, labels


def pretrain(model, tokenizer, task_name: str, *, steps: int, batch_size: int = 64, lr: float = 3e-3,
             p_correct: float = 0.4, noise: str = "systematic", clean_fraction: float = 0.5, seed: int = 0,
             warmup: int = 50,
             log: Callable[[str], Any] | None = print,
             log_every: int = 100, **task_kwargs: Any) -> dict[str, Any]:
    """Next-token training on ``task_name``'s train split, loss on completion + EOS only.

    The first ``clean_fraction`` of the steps use correct labels (the model learns the task
    reliably: straight noisy training stalled for some seeds); after that each drawn example's
    label is correct w.p. ``p_correct``, else a ``noise``-kind wrong answer (see
    :func:`grpo_dist.data.synthetic.noisy_completion`), so the model ends calibrated to that mix."""
    from grpo_dist.data.synthetic import make_task, noisy_completion

    records = make_task(task_name, None, seed=seed, split="train", **task_kwargs)
    rng = random.Random(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.98), weight_decay=0.01)

    def lr_at(step: int) -> float:  # linear warmup, cosine decay to 10%
        if step < warmup:
            return (step + 1) / warmup
        t = (step - warmup) / max(1, steps - warmup)
        return 0.1 + 0.45 * (1 + math.cos(math.pi * t))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_at)
    clean_steps = int(round(clean_fraction * steps))
    model.train()
    losses: list[float] = []
    t0 = time.time()
    for step in range(steps):
        batch = rng.sample(records, min(batch_size, len(records)))
        p = 1.0 if step < clean_steps else p_correct
        completions = [noisy_completion(r, rng, p, noise) for r in batch]
        ids, mask, labels = _encode_batch(tokenizer, [r.prompt for r in batch], completions)
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        losses.append(loss.item())
        if log is not None and log_every and ((step + 1) % log_every == 0 or step + 1 == steps):
            recent = losses[-log_every:]
            log(f"pretrain {task_name} step {step + 1}/{steps} loss {sum(recent) / len(recent):.4f} "
                f"({time.time() - t0:.1f}s)")
    model.eval()
    k = max(1, min(20, len(losses) // 5))
    return {"steps": steps, "batch_size": batch_size, "lr": lr, "p_correct": p_correct, "noise": noise,
            "clean_fraction": clean_fraction,
            "loss_first": sum(losses[:k]) / k, "loss_last": sum(losses[-k:]) / k,
            "train_seconds": time.time() - t0}
