"""Held-out accuracy of an in-memory model on a synthetic task, without an inference engine:
the check ``make_tiny_model`` runs after pretraining (batched by prompt length, exact)."""

from __future__ import annotations

from typing import Any

import torch

from grpo_dist.models.model import MAX_POSITIONS


@torch.no_grad()
def generate(model, tokenizer, prompts: list[str], *, max_new_tokens: int = 6, temperature: float = 0.0,
             generator: torch.Generator | None = None) -> list[str]:
    """Completions for ``prompts`` (greedy if ``temperature == 0``), stopping at EOS.

    No padding and no KV cache: prompts are grouped by token length and each group is
    re-run in full per new token, which is exact and cheap for short character-level
    sequences."""
    model.eval()
    eos = tokenizer.eos_token_id
    encoded = tokenizer(prompts, add_special_tokens=True)["input_ids"]
    out: list[list[int]] = [[] for _ in prompts]
    groups: dict[int, list[int]] = {}
    for i, ids in enumerate(encoded):
        groups.setdefault(len(ids), []).append(i)
    for length, idx in sorted(groups.items()):
        seq = torch.tensor([encoded[i] for i in idx], dtype=torch.long)
        done = torch.zeros(len(idx), dtype=torch.bool)
        for _ in range(min(max_new_tokens, MAX_POSITIONS - length)):
            logits = model(input_ids=seq).logits[:, -1, :].float()
            if temperature > 0:
                probs = torch.softmax(logits / temperature, dim=-1)
                nxt = torch.multinomial(probs, 1, generator=generator).squeeze(1)
            else:
                nxt = logits.argmax(-1)
            nxt = torch.where(done, torch.full_like(nxt, eos), nxt)
            for row, i in enumerate(idx):
                if not done[row] and nxt[row].item() != eos:
                    out[i].append(int(nxt[row]))
            done |= nxt == eos
            seq = torch.cat([seq, nxt[:, None]], dim=1)
            if bool(done.all()):
                break
    return [tokenizer.decode(ids, skip_special_tokens=True) for ids in out]


def evaluate(model, tokenizer, task_name: str, *, n: int = 200, samples: int = 4, temperature: float = 1.0,
             seed: int = 0, max_new_tokens: int = 6, **task_kwargs: Any) -> dict[str, float]:
    """Held-out accuracy of ``model`` on ``task_name``: greedy, and sampled (``samples`` per prompt)."""
    from grpo_dist.data.synthetic import get_task, make_task

    task = get_task(task_name)
    records = make_task(task_name, n, seed=seed, split="eval", **task_kwargs)
    prompts = [r.prompt for r in records]
    greedy = generate(model, tokenizer, prompts, max_new_tokens=max_new_tokens)
    gen = torch.Generator().manual_seed(seed)
    sampled = generate(model, tokenizer, [p for p in prompts for _ in range(samples)],
                       max_new_tokens=max_new_tokens, temperature=temperature, generator=gen)
    g_acc = sum(task.check(c, r.answer) for c, r in zip(greedy, records)) / len(records)
    s_acc = sum(task.check(c, records[i // samples].answer) for i, c in enumerate(sampled)) / len(sampled)
    return {"eval_greedy_acc": g_acc, "eval_sampled_acc": s_acc, "eval_n": len(records),
            "eval_samples": samples, "eval_temperature": temperature}
