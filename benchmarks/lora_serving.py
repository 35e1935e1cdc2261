"""How engines serve several adapters on CPU (issue 53 item 2): vLLM's LoRA kernels against merged weights.

One vLLM CPU engine in this process, N random LoRA adapters (rank ``--rank`` on every projection) of
one base, ``--prompts`` prompts x ``--group`` samples of ``--tokens`` tokens per adapter:

* ``lora``: an engine with ``enable_lora`` and ``max_loras = N`` generates every adapter's requests
  in one batch, each request naming its adapter (multi-LoRA serving);
* ``merged``: an engine without LoRA serves one adapter at a time: for each adapter, its weights
  merged into the base are loaded in place (``LoraMerger.iter_merged`` -> the worker extension, as
  ``RolloutWorker.serve`` does), then its requests generate.

Per mode: seconds for all adapters' requests, completion tokens per second, and for ``merged`` the
seconds spent loading. One invocation measures both on one machine (printed)::

    python benchmarks/lora_serving.py --model small --adapters 4
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))


def make_adapters(base: Path, n: int, rank: int, work: Path) -> list[Path]:
    """N PEFT adapter directories of ``base`` with seeded random A and B (every LoRA tensor non-zero)."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    out = []
    for i in range(n):
        d = work / f"adapter{i}"
        if not (d / "adapter_config.json").exists():
            model = AutoModelForCausalLM.from_pretrained(str(base), dtype=torch.float32)
            peft = get_peft_model(model, LoraConfig(r=rank, lora_alpha=2 * rank, task_type="CAUSAL_LM",
                                                    target_modules=["q_proj", "k_proj", "v_proj", "o_proj",
                                                                    "gate_proj", "up_proj", "down_proj"]))
            g = torch.Generator().manual_seed(i)
            with torch.no_grad():
                for name, p in peft.named_parameters():
                    if "lora_" in name:
                        p.copy_(torch.randn(p.shape, generator=g) * 0.02)
            peft.save_pretrained(str(d))
        out.append(d)
    return out


def prompts(n: int, vocab: int) -> list[list[int]]:
    import random

    rng = random.Random(0)
    return [[rng.randrange(4, vocab) for _ in range(rng.randint(8, 16))] for _ in range(n)]


def run_lora(base: Path, adapters: list[Path], ids, args) -> dict:
    from vllm.lora.request import LoRARequest

    from grpo_dist.rollout.base import SamplingSpec
    from grpo_dist.rollout.vllm_engine import VLLMGenerator, sampling_params

    eng = VLLMGenerator(str(base), enable_lora=True, in_process=True, lora_rank=args.rank, max_loras=len(adapters),
                        max_model_len=args.max_model_len, cpu_kvcache_gb=1)
    try:
        from vllm import TokensPrompt

        spec = SamplingSpec(n=args.group, temperature=1.0, top_p=1.0, top_k=-1, max_tokens=args.tokens, stop=[])
        reqs = [LoRARequest(f"a{i}", i + 1, str(p)) for i, p in enumerate(adapters)]

        def go():
            ps = [TokensPrompt(prompt_token_ids=list(x)) for _ in reqs for x in ids]
            loras = [r for r in reqs for _ in ids]
            params = [sampling_params(spec, 1, 1000 * k + j) for k in range(len(ps)) for j in range(args.group)]
            flat = [p for p in ps for _ in range(args.group)]
            flat_l = [r for r in loras for _ in range(args.group)]
            outs = eng.llm.generate(flat, params, use_tqdm=False, lora_request=flat_l)
            return sum(len(o.outputs[0].token_ids) for o in outs)

        eng._call(go)  # warm-up: adapters loaded, kernels touched
        t0 = time.perf_counter()
        tokens = eng._call(go)
        return {"seconds": time.perf_counter() - t0, "tokens": tokens, "load_s": 0.0}
    finally:
        eng.close()


def run_merged(base: Path, adapters: list[Path], ids, args) -> dict:
    from grpo_dist.rollout.base import SamplingSpec
    from grpo_dist.rollout.vllm_engine import LOAD_EXTENSION, VLLMGenerator
    from grpo_dist.sync.merge import LoraMerger, read_adapter_dir

    import torch

    eng = VLLMGenerator(str(base), enable_lora=False, in_process=True, max_model_len=args.max_model_len,
                        cpu_kvcache_gb=1, worker_extension_cls=LOAD_EXTENSION)
    try:
        merger = LoraMerger.shared(str(base), dtype=torch.float32)
        loaded = [read_adapter_dir(str(p)) for p in adapters]
        spec = SamplingSpec(n=args.group, temperature=1.0, top_p=1.0, top_k=-1, max_tokens=args.tokens, stop=[])
        seeds = [[1000 * k + j for j in range(args.group)] for k in range(len(ids))]

        def one_pass() -> tuple[int, float]:
            tokens, load = 0, 0.0
            for tensors, cfg in loaded:
                t = time.perf_counter()
                eng.load_state(merger.iter_merged(tensors, cfg, partial=True))
                load += time.perf_counter() - t
                tokens += sum(len(s.token_ids) for g in eng.generate(ids, spec, seeds=seeds) for s in g)
            return tokens, load

        one_pass()  # warm-up
        t0 = time.perf_counter()
        tokens, load = one_pass()
        return {"seconds": time.perf_counter() - t0, "tokens": tokens, "load_s": load}
    finally:
        eng.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", choices=["tiny", "small"], default="small")
    ap.add_argument("--adapters", type=int, default=4)
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--max-model-len", type=int, default=128)
    ap.add_argument("--work", default="/tmp/lora_serving_bench")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    from grpo_dist.models import make_tiny_model
    from grpo_dist.util.procenv import setup_env
    from multi_lora import cpu_name

    setup_env()
    work = Path(a.work)
    base = work / f"base-{a.model}"
    if not (base / "config.json").exists():
        make_tiny_model(str(base), size=a.model, seed=0, log=None)
    adapters = make_adapters(base, a.adapters, a.rank, work / a.model)
    import json as _json

    vocab = _json.loads((base / "config.json").read_text())["vocab_size"]
    ids = prompts(a.prompts, vocab)
    res = {"merged": run_merged(base, adapters, ids, a), "lora": run_lora(base, adapters, ids, a)}
    print(f"\nCPU: {cpu_name()}; model {a.model}; {a.adapters} adapters of rank {a.rank}; per adapter "
          f"{a.prompts} prompts x {a.group} samples of up to {a.tokens} tokens\n")
    print("| engine | seconds (all adapters) | completion tokens/s | of which loading s |")
    print("|---|---|---|---|")
    for mode, r in res.items():
        print(f"| {mode} | {r['seconds']:.2f} | {r['tokens'] / r['seconds']:.0f} | {r['load_s']:.2f} |")
    ratio = res["lora"]["seconds"] / res["merged"]["seconds"]
    print(f"\nLoRA kernels / merged: {ratio:.2f}x the time")
    if a.out:
        Path(a.out).write_text(json.dumps({"cpu": cpu_name(), "args": vars(a), "results": res, "ratio": ratio,
                                           "date": time.strftime("%Y-%m-%d")}, indent=1))
    os._exit(0)  # the engines are shut down; skip vLLM's atexit work


if __name__ == "__main__":
    main()
