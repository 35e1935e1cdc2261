"""Local tiny models: a seeded Llama + a character-level tokenizer, optionally pretrained on a
synthetic task with deliberately wrong labels (so that GRPO has something to fix).

Pretraining recipe (``pretrain``): half the steps on correct labels, then labels correct with
probability ``p_correct`` (0.4) and otherwise one too many ("systematic" noise). The model ends
knowing the format and the arithmetic but biased: sampled held-out accuracy ~0.35-0.42 at
temperature 1, and on-policy GRPO (LoRA, lr 1e-3) removes the bias within a few dozen steps.

    info = make_tiny_model("models/tiny-add", size="tiny", pretrain_task="add")

The directory loads with ``AutoModelForCausalLM`` / ``AutoTokenizer``, PEFT and vLLM (CPU
build: head_dim >= 32). ``python -m grpo_dist.models.tiny OUT --pretrain-task add`` does the same.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import string
import time
from typing import Any, Callable

import torch

SPECIAL_TOKENS = {"pad": "<pad>", "bos": "<s>", "eos": "</s>", "unk": "<unk>"}
# Every printable ASCII character (covers digits, letters, punctuation, operators and the
# characters of <think></think><answer></answer>), plus space, newline and tab.
CHARACTERS = sorted(set(string.printable) - set("\r\x0b\x0c"))
CHAT_TEMPLATE = (
    "{% for message in messages %}{{ message['role'] }}: {{ message['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant: {% endif %}"
)
SIZES: dict[str, dict[str, int]] = {
    "tiny": dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2),
    "small": dict(hidden_size=512, intermediate_size=1408, num_hidden_layers=8,
                  num_attention_heads=8, num_key_value_heads=4),
}
MAX_POSITIONS = 256
# Pretraining defaults per size: steps, batch size, peak learning rate.
PRETRAIN_DEFAULTS: dict[str, dict[str, float]] = {
    "tiny": dict(steps=2000, batch_size=64, lr=1e-3),
    "small": dict(steps=600, batch_size=64, lr=1e-3),
}
INFO_FILE = "tiny_model_info.json"


def build_tokenizer():
    """The character-level ``PreTrainedTokenizerFast`` (BOS prepended, no spaces on decode)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate([SPECIAL_TOKENS[k] for k in ("pad", "bos", "eos", "unk")])}
    for ch in CHARACTERS:
        vocab[ch] = len(vocab)
    core = Tokenizer(models.WordLevel(vocab, unk_token=SPECIAL_TOKENS["unk"]))
    core.pre_tokenizer = pre_tokenizers.Split("", behavior="isolated")  # one token per character
    core.decoder = decoders.Fuse()  # join tokens with no separator
    bos = SPECIAL_TOKENS["bos"]
    core.post_processor = processors.TemplateProcessing(
        single=f"{bos} $A", pair=f"{bos} $A $B", special_tokens=[(bos, vocab[bos])])
    tok = PreTrainedTokenizerFast(
        tokenizer_object=core,
        bos_token=bos, eos_token=SPECIAL_TOKENS["eos"], pad_token=SPECIAL_TOKENS["pad"],
        unk_token=SPECIAL_TOKENS["unk"], model_max_length=MAX_POSITIONS,
        clean_up_tokenization_spaces=False, padding_side="right",
    )
    tok.chat_template = CHAT_TEMPLATE
    return tok


def build_model(tokenizer, size: str = "tiny", seed: int = 0):
    """A freshly initialised, seeded ``LlamaForCausalLM`` sized by ``SIZES[size]``."""
    from transformers import LlamaConfig, LlamaForCausalLM

    if size not in SIZES:
        raise ValueError(f"unknown size {size!r}; expected one of {sorted(SIZES)}")
    dims = SIZES[size]
    config = LlamaConfig(
        vocab_size=len(tokenizer), max_position_embeddings=MAX_POSITIONS,
        rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=False,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id, head_dim=dims["hidden_size"] // dims["num_attention_heads"],
        **dims,
    )
    torch.manual_seed(seed)
    return LlamaForCausalLM(config).float()


# ------------------------------------------------------------------------------ pretraining

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


# ------------------------------------------------------------------------------ entry point

def make_tiny_model(out_dir: str, size: str = "tiny", seed: int = 0, pretrain_task: str | None = None,
                    steps: int | None = None, log: Callable[[str], Any] | None = print, *,
                    p_correct: float = 0.4, noise: str = "systematic", clean_fraction: float = 0.5,
                    batch_size: int | None = None, lr: float | None = None, eval_n: int = 200, eval_samples: int = 4, threads: int | None = 1,
                    **task_kwargs: Any) -> dict[str, Any]:
    """Build (and optionally pretrain) a tiny Llama + char tokenizer into ``out_dir``.

    Returns an info dict (also saved as ``tiny_model_info.json``): size, seed, parameter
    count, vocab size and, when ``pretrain_task`` is given, the training summary
    (``loss_first``, ``loss_last``, ``train_seconds``) and held-out ``eval_greedy_acc`` /
    ``eval_sampled_acc`` (temperature 1.0, ``eval_samples`` per prompt). Same arguments, same model.
    ``steps``/``batch_size``/``lr`` default to ``PRETRAIN_DEFAULTS[size]``; ``task_kwargs`` (e.g.
    ``max_operand``) go to the task, for training and evaluation alike.
    ``threads`` sets ``torch.set_num_threads`` (1 by default: these matmuls are too small to gain
    from more, and 2 threads on a busy 2-core machine ran ~15x slower; None leaves it alone).
    """
    from transformers import GenerationConfig

    if threads:
        torch.set_num_threads(threads)
    random.seed(seed)
    t0 = time.time()
    tokenizer = build_tokenizer()
    model = build_model(tokenizer, size=size, seed=seed)
    info: dict[str, Any] = {
        "out_dir": os.path.abspath(out_dir), "size": size, "seed": seed, "vocab_size": len(tokenizer),
        "num_parameters": sum(p.numel() for p in model.parameters()), "pretrain_task": pretrain_task,
        "task_kwargs": dict(task_kwargs),
    }
    if pretrain_task is not None:
        defaults = PRETRAIN_DEFAULTS.get(size, PRETRAIN_DEFAULTS["tiny"])
        torch.manual_seed(seed)
        info.update(pretrain(
            model, tokenizer, pretrain_task, steps=int(steps if steps is not None else defaults["steps"]),
            batch_size=int(batch_size or defaults["batch_size"]), lr=float(lr or defaults["lr"]),
            p_correct=p_correct, noise=noise, clean_fraction=clean_fraction, seed=seed, log=log,
            **task_kwargs))
        info.update(evaluate(model, tokenizer, pretrain_task, n=eval_n, samples=eval_samples,
                             seed=seed, **task_kwargs))
        if log is not None:
            log(f"held-out {pretrain_task}: greedy acc {info['eval_greedy_acc']:.3f}, sampled acc "
                f"(T=1.0, {eval_samples}/prompt) {info['eval_sampled_acc']:.3f} on {info['eval_n']} prompts")
    os.makedirs(out_dir, exist_ok=True)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    GenerationConfig(bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                     pad_token_id=tokenizer.pad_token_id).save_pretrained(out_dir)
    info["total_seconds"] = time.time() - t0
    with open(os.path.join(out_dir, INFO_FILE), "w") as f:
        json.dump(info, f, indent=2)
    return info


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description="Build a local tiny Llama + character tokenizer.")
    p.add_argument("out_dir")
    p.add_argument("--size", default="tiny", choices=sorted(SIZES))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--pretrain-task", default=None)
    p.add_argument("--steps", type=int, default=None)
    p.add_argument("--p-correct", type=float, default=0.4)
    p.add_argument("--noise", default="systematic", choices=["systematic", "near", "spread"])
    p.add_argument("--clean-fraction", type=float, default=0.5)
    p.add_argument("--lr", type=float, default=None)
    p.add_argument("--batch-size", type=int, default=None)
    args = p.parse_args(argv)
    info = make_tiny_model(args.out_dir, size=args.size, seed=args.seed, pretrain_task=args.pretrain_task,
                           steps=args.steps, p_correct=args.p_correct, noise=args.noise,
                           clean_fraction=args.clean_fraction, lr=args.lr,
                           batch_size=args.batch_size)
    print(json.dumps(info, indent=2))
    return info


if __name__ == "__main__":
    main()
