"""Each stage's distance from its compute floor at this machine's matmul roof.

A stage's floor is its model FLOPs over the roof: the best square GEMM this machine runs in the
stage's precision with all its cores (``grpo_dist.learner.perf.matmul_roof``, the roof the learner
divides ``perf/mfu`` by; measured before and after the runs, the better of the two kept, since a
shared machine only ever lowers it). FLOPs are counted as ``grpo_dist.learner.perf`` counts them
(the Kaplan convention: ``N`` = the parameters less the input and output embeddings, attention
and the LM head left out) over ``T`` = the step's prompt tokens once per prompt plus its
completion tokens (what a packed pass or a prefix-sharing engine runs; a lower bound for both
systems):

* generate: ``2 N T`` (prefill of each prompt once + one forward per completion token);
* reference (the KL reference's no-grad pass): ``2 N T``;
* update (LoRA: forward + the backward through the frozen base for the input gradients): ``4 N T``.

The report prints measured / floor per stage (median over the steps): 1.0 would be the whole
stage at the roof; the excess is everything else (attention, the LM head, sampling, padding,
memory-bound kernels, Python, waiting).
"""

from __future__ import annotations

import os
from typing import Any

STAGE_FLOPS = {"generate": 2.0, "ref_logp": 2.0, "update": 4.0}  # x N x T
DTYPES = {"fp32": "float32", "bf16": "bfloat16"}


def measure_roofs(threads: int | None = None, budget_s: float = 1.0) -> dict[str, float]:
    """FLOP/s of the best square GEMM per precision (``fp32``, ``bf16``) with ``threads`` torch
    threads (default: every core), measured afresh (the per-process cache of ``matmul_roof`` is
    bypassed so a second call measures again)."""
    import torch

    from grpo_dist.learner import perf

    old = torch.get_num_threads()
    torch.set_num_threads(threads or os.cpu_count() or 1)
    try:
        out = {}
        for prec, dtype in DTYPES.items():
            perf._ROOFS.clear()  # measured now, not the value cached by an earlier call
            out[prec] = perf.matmul_roof(getattr(torch, dtype), budget_s=budget_s)
        return out
    finally:
        perf._ROOFS.clear()
        torch.set_num_threads(old)


def best_roofs(*measured: dict[str, float]) -> dict[str, float]:
    return {p: max(m.get(p, 0.0) for m in measured) for p in DTYPES}


def model_params(model_path: str) -> int:
    """``N``: the model's parameters less its input and output embeddings (the base model, built on
    the meta device from its config: nothing is loaded)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from grpo_dist.learner.perf import non_embedding_params

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model_path))
    return non_embedding_params(model)


def step_prompt_tokens(rows: list[dict[str, Any]], model_path: str, per_step: int, chat: bool) -> list[int]:
    """Prompt tokens of each step (``per_step`` prompts a step, in ``rows``' order), tokenized as
    the rollout does (a rendered chat template already holds its special tokens)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_path)
    lens = [len(ids) for ids in tok([r["prompt"] for r in rows], add_special_tokens=not chat)["input_ids"]]
    return [sum(lens[i:i + per_step]) for i in range(0, len(lens), per_step)]


def floor_context(workload: str, model_path: str, steps: int, roofs: dict[str, float]) -> dict[str, Any]:
    """What :func:`annotate` needs, stored in the report's JSON: N, the roofs, each step's prompt tokens."""
    from trl_bench.workloads import WORKLOADS, prompt_rows

    w = WORKLOADS[workload]
    chat = w["chat_template"]
    if "env" in w:  # the environment's opening, rendered as grpo_dist renders it (tools in the template)
        from trl_bench.tool_workload import rendered_prompts

        rows, chat = [{"prompt": p} for p in rendered_prompts(w, model_path, steps)], True
    elif chat:
        rows = prompt_rows(workload, model_path, steps)  # grpo_dist's stream order = TRL's
    else:  # the order of grpo_dist's stream (TRL shuffles its own; the add prompts differ by a token or two)
        from grpo_dist.data.sources import PromptStream, load_prompts

        recs = PromptStream(load_prompts(w["data"]), seed=w["seed"]).next_batch(steps * w["prompts"])
        rows = [{"prompt": r.prompt} for r in recs]
    return {"params": model_params(model_path), "roofs": roofs, "threads": os.cpu_count(),
            "prompt_tokens": step_prompt_tokens(rows, model_path, w["prompts"], chat)}


def annotate(steps: list[dict[str, Any]], name: str, floor: dict[str, Any]) -> None:
    """Add ``<stage>_x`` (measured / floor) to each step record of setting ``name`` (step i's prompt
    tokens from ``floor["prompt_tokens"][i]``; ``tokens`` = the step's completion tokens)."""
    from trl_bench.workloads import stage_precision

    ptoks = floor["prompt_tokens"]
    for i, rec in enumerate(steps):
        t = (ptoks[i] if i < len(ptoks) else float("nan")) + rec.get("tokens", float("nan"))
        for stage, k in STAGE_FLOPS.items():
            roof = floor["roofs"].get(stage_precision(name, stage), 0.0)
            floor_s = k * floor["params"] * t / roof if roof > 0 else float("nan")
            rec[f"{stage}_floor_s"] = floor_s
            rec[f"{stage}_x"] = rec.get(stage, float("nan")) / floor_s if floor_s > 0 else float("nan")


def describe(floor: dict[str, Any]) -> str:
    """One line: N, the roofs, the FLOP counts."""
    r = floor["roofs"]
    p = floor["prompt_tokens"]
    return (f"Floors: N = {floor['params'] / 1e6:.1f}M non-embedding parameters; roofs (best square GEMM, "
            f"{floor['threads']} threads, better of before/after the runs): fp32 {r['fp32'] / 1e9:.0f} GFLOP/s, "
            f"bf16 {r['bf16'] / 1e9:.0f} GFLOP/s; FLOPs per step: generate 2NT, reference 2NT, update 4NT "
            f"(T = prompt tokens once per prompt, {sum(p) / max(1, len(p)):.0f} a step, + completion tokens); "
            f"x floor = measured s / (FLOPs / roof at the stage's precision)")
