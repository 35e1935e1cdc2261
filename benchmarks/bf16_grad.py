"""The learner's first gradient in bf16 against float32, on the same batch: how far a bf16 base
(with the adapter in float32, ``lora.dtype: float32``, or in bf16, ``lora.dtype: model``) moves the
GRPO gradient from the all-float32 one.

    python benchmarks/bf16_grad.py [MODEL_DIR] [--prompts 8] [--group 8] [--micro 8]

The batch: the recipe's word problems (``builtin:word_problems?difficulty=1``) in SmolLM2's chat
template, each with ``--group`` completions, half of them the right sum in a sentence and the box,
half off by one (advantage +1 / -1); a last row takes float32 again on the same prompts with other
wrong answers (seed 1): the scale of a batch's own noise, for comparison. The adapter starts as the learner builds it (B = 0), then B
gets seeded noise (as after a few steps), the same in every setting. Per setting: the gradient's
cosine with the float32 one and its relative error ``|g - g32| / |g32|``, over all adapter tensors.
"""

from __future__ import annotations

import argparse
import os
import random
import sys

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

SETTINGS = [("float32", "float32"), ("bfloat16", "float32"), ("bfloat16", "model")]  # (model.dtype, lora.dtype)


def batch_for(model_dir: str, prompts: int, group: int, seed: int = 0, offset: int = 0):
    from transformers import AutoTokenizer

    from grpo_dist.data import load_prompts
    from grpo_dist.types import TrainBatch

    tok = AutoTokenizer.from_pretrained(model_dir)
    records = load_prompts("builtin:word_problems?difficulty=1", split="train")[offset:offset + prompts]
    rng = random.Random(seed)
    p_ids, c_ids, adv = [], [], []
    for r in records:
        chat = tok.apply_chat_template([{"role": "user", "content": r.prompt}], tokenize=False,
                                       add_generation_prompt=True)
        ids = tok(chat, add_special_tokens=False)["input_ids"]
        right = int(r.columns["answer"])
        for j in range(group):
            good = j % 2 == 0
            n = right if good else right + rng.choice([-1, 1])
            c_ids.append(tok(f"The answer is {n}. \\boxed{{{n}}}", add_special_tokens=False)["input_ids"]
                         + [tok.eos_token_id])
            p_ids.append(ids)
            adv.append(1.0 if good else -1.0)
    return TrainBatch(prompt_ids=p_ids, completion_ids=c_ids, behaviour_logprobs=[], advantages=adv)


def first_gradient(model_dir: str, model_dtype: str, lora_dtype: str, batch, micro: int) -> dict[str, torch.Tensor]:
    from grpo_dist.testing.learner import make_learner, randomize_lora, small_config, train_step_with_grads

    n = len(batch)
    cfg = small_config(model_dir, lora=dict(r=16, alpha=32, dtype=lora_dtype),
                       rollout=dict(prompts_per_step=1, group_size=n, max_tokens=32),
                       learner=dict(micro_batch_size=micro, lr=5e-4), cluster=dict(torch_threads=2))
    cfg.model.dtype = model_dtype
    learner, _ = make_learner(cfg)
    randomize_lora(learner, seed=3, std=0.002)
    grads, _ = train_step_with_grads(learner, batch)
    learner.shutdown()
    return {k: v.float() for k, v in grads.items()}


def _flat(grads: dict[str, torch.Tensor], keys: list[str]) -> torch.Tensor:
    return torch.cat([grads[k].flatten() for k in keys]).double()


def _cos(x: torch.Tensor, y: torch.Tensor) -> float:
    return float(x @ y / (x.norm() * y.norm()))


def adapter_effect(model_dir: str, adapter: str, batch, dtype: str) -> torch.Tensor:
    """Per completion token: log p with the adapter minus log p without it, the base in ``dtype`` and
    the adapter in float32 (PEFT's default: the layer's output is rounded to ``dtype`` after the
    adapter's contribution is added)."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, dtype))
    model = PeftModel.from_pretrained(base, adapter).eval()
    out = []
    with torch.no_grad():
        for p, c in zip(batch.prompt_ids, batch.completion_ids):
            ids = torch.tensor([p + c])
            def logp(m):
                logits = m(input_ids=ids).logits[0, len(p) - 1:-1].float()
                return torch.log_softmax(logits, -1).gather(-1, torch.tensor(c)[:, None])[:, 0]
            with model.disable_adapter():
                off = logp(model)
            out.append(logp(model) - off)
    return torch.cat(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", nargs="?", default=os.path.join(ROOT, ".cache", "models", "smollm2-135m-instruct-0.1.2"))
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--micro", type=int, default=8)
    ap.add_argument("--bias", action="store_true", help="instead: is bf16's error the same on other prompts? the "
                    "cosine between its errors (g16 - g32) on two disjoint prompt sets")
    ap.add_argument("--adapter", help="instead: what a float32 and a bf16 forward see of this trained adapter "
                    "(its change of the completions' log-probs)")
    a = ap.parse_args(argv)
    from grpo_dist.util.procenv import setup_env

    setup_env()
    batch = batch_for(a.model, a.prompts, a.group)
    if a.bias:
        errs, gs = [], []
        for off in (0, a.prompts):
            b = batch_for(a.model, a.prompts, a.group, offset=off)
            g32, g16 = (first_gradient(a.model, d, "float32", b, a.micro) for d in ("float32", "bfloat16"))
            v32, v16 = (_flat(g, sorted(g32)) for g in (g32, g16))
            errs.append(v16 - v32)
            gs.append(v32)
        print(f"bf16 error on prompts 1-{a.prompts} vs {a.prompts + 1}-{2 * a.prompts}: cosine {_cos(*errs):.4f}; "
              f"error vs its own gradient: {_cos(errs[0], gs[0]):.4f}, {_cos(errs[1], gs[1]):.4f}; the two float32 "
              f"gradients: {_cos(*gs):.4f}")
        return 0
    if a.adapter:
        d32, d16 = (adapter_effect(a.model, a.adapter, batch, d).double() for d in ("float32", "bfloat16"))
        print(f"{a.adapter}: {d32.numel()} completion tokens; the adapter's change of log p, float32 base: mean |d| "
              f"{float(d32.abs().mean()):.4f}; bf16 base: cosine with float32 {_cos(d16, d32):.4f}, relative error "
              f"{float((d16 - d32).norm() / d32.norm()):.4f}, norm ratio {float(d16.norm() / d32.norm()):.4f}")
        return 0
    grads = {s: first_gradient(a.model, *s, batch, a.micro) for s in SETTINGS}
    # the scale of batch noise: float32 again, the same prompts with other wrong answers
    grads[("float32", "float32 (other batch)")] = first_gradient(a.model, "float32", "float32",
                                                                  batch_for(a.model, a.prompts, a.group, seed=1), a.micro)
    ref = grads[SETTINGS[0]]
    keys = sorted(ref)
    g32 = _flat(ref, keys)
    print(f"{len(batch)} sequences, micro-batches of {a.micro}, {len(keys)} adapter tensors, |g32| {g32.norm():.4g}")
    print("| model.dtype | lora.dtype | cosine with float32 | relative error | norm ratio |")
    print("|---|---|---|---|---|")
    for s in grads:
        g = _flat(grads[s], keys)
        print(f"| {s[0]} | {s[1]} | {_cos(g, g32):.4f} | {float((g - g32).norm() / g32.norm()):.4f} | "
              f"{float(g.norm() / g32.norm()):.4f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
