"""Local tiny models: a seeded Llama + a character-level tokenizer, optionally pretrained on a
synthetic task with deliberately wrong labels (so that GRPO has something to fix).

``make_tiny_model`` puts together the pieces: the architecture (``model.py``), the tokenizer
(``tokenizer.py``), the pretraining recipe (``pretrain.py``) and the held-out check
(``heldout.py``). After pretraining on ``add`` the model knows the format and the arithmetic but is
biased: its sampled held-out accuracy at temperature 1 is low, and on-policy GRPO (LoRA, lr 1e-3)
removes the bias within a few dozen steps (README's demo gives the figures).

    info = make_tiny_model("models/tiny-add", size="tiny", pretrain_task="add")

The directory loads with ``AutoModelForCausalLM`` / ``AutoTokenizer``, PEFT and vLLM (CPU
build: head_dim >= 32). From the shell: ``grpo-dist make-tiny-model OUT --pretrain-task add``.
"""

from __future__ import annotations

import json
import os
import random
import time
from typing import Any, Callable

import torch

from grpo_dist.models.heldout import evaluate
from grpo_dist.models.model import build_model
from grpo_dist.models.pretrain import PRETRAIN_DEFAULTS, pretrain
from grpo_dist.models.tokenizer import build_tokenizer

INFO_FILE = "tiny_model_info.json"


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
    from more, and threads competing for busy cores run far slower; None leaves it alone).
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
