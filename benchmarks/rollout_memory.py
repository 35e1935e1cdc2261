"""Where a rollout actor's memory goes: one RolloutWorker in this process (no Ray), stage by stage.

    python benchmarks/rollout_memory.py [--steps 4] [--eval-prompts 64] [--section.key VALUE ...]

The config is configs/smollm2_cpu.yaml (``--config`` for another) with the overrides given. The
worker starts its engine (and, merging adapters, its merger), then for each step generates one
step's prompts x group_size and loads a new random LoRA version (the recipe's rank and targets,
``init_lora_weights=False``), the way a run alternates them; last, an evaluation-sized call
(``--eval-prompts`` x ``eval.samples_per_prompt``). After each stage it prints the process's
resident memory from /proc/self/status: VmRSS, its peak VmHWM, and the anonymous and
file-backed parts (a merger's base weights are safetensors mapped from the model file: clean
file pages, RssFile). Each stage's seconds next to it.

Compare settings in one invocation each, one after another (``--rollout.cpu_kvcache_gb 1`` vs
``0.75``; an older tree for the load path): memory is read per process, so a busy machine changes
the seconds, not the megabytes.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
KEYS = ("VmRSS", "VmHWM", "RssAnon", "RssFile")


def status_mb() -> dict[str, int]:
    from learner_roof import _status_mb

    return {k: int(_status_mb(k)) for k in KEYS}


def random_update(model_dir: str, cfg, version: int):
    import torch
    from peft import LoraConfig, get_peft_model, get_peft_model_state_dict
    from transformers import AutoModelForCausalLM

    from grpo_dist.types import AdapterUpdate

    torch.manual_seed(version)
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32),
                           LoraConfig(r=cfg.lora.r, lora_alpha=cfg.lora.alpha, target_modules=list(cfg.lora.target_modules),
                                      init_lora_weights=False))
    peft_config = {k: (sorted(v) if isinstance(v, set) else v) for k, v in model.peft_config["default"].to_dict().items()}
    return AdapterUpdate(version, {k: t.detach().clone() for k, t in get_peft_model_state_dict(model).items()},
                         peft_config)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default=str(ROOT / "configs" / "smollm2_cpu.yaml"))
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--eval-prompts", type=int, default=64)
    args, overrides = p.parse_known_args()

    from grpo_dist.util.procenv import setup_env

    setup_env()
    from grpo_dist.config import load_config
    from grpo_dist.hub import local_model_dir

    cfg = load_config(args.config, overrides)
    model_dir = str(local_model_dir(cfg.model.path))
    cfg = load_config(args.config, overrides + ["--model.path", model_dir])  # the actor's view: a local directory
    from learner_roof import cpu_line

    print(f"machine: {cpu_line()}; KV cache {cfg.rollout.cpu_kvcache_gb or 'default'} GiB, "
          f"{cfg.rollout.prompts_per_step} prompts x {cfg.rollout.group_size}, max_tokens {cfg.rollout.max_tokens}",
          flush=True)
    rows = [("start", 0.0, status_mb())]

    def stage(name: str, fn):
        t0 = time.perf_counter()
        out = fn()
        rows.append((name, time.perf_counter() - t0, status_mb()))
        print(f"{name}: {rows[-1][1]:.1f} s {rows[-1][2]}", flush=True)
        return out

    from transformers import AutoTokenizer

    from grpo_dist.data import load_prompts
    from grpo_dist.rollout.worker import RolloutWorker

    worker = RolloutWorker(cfg)
    stage("engine started (setup)", worker.setup)
    loads = "in memory" if worker.engine.loads_in_memory else "through a file"
    n = cfg.rollout.prompts_per_step
    prompts = load_prompts(cfg.data.path, chat_template=cfg.data.chat_template, limit=max(n * args.steps, args.eval_prompts),
                           tokenizer=AutoTokenizer.from_pretrained(model_dir))
    updates = [random_update(model_dir, cfg, v) for v in range(1, args.steps + 1)]
    for step in range(args.steps):
        stage(f"generate, step {step + 1}", lambda: worker.generate(prompts[step * n:(step + 1) * n], seed=step))
        stage(f"load version {step + 1} ({loads})", lambda: worker.load_weights(updates[step]))
    k = cfg.eval.samples_per_prompt
    stage(f"evaluation call: {args.eval_prompts} x {k}", lambda: worker.generate(prompts[:args.eval_prompts], n=k, seed=99))
    worker.close()
    print()
    print("| stage | s | VmRSS MB | peak (VmHWM) MB | anonymous MB | file-backed MB |")
    print("|---|---|---|---|---|---|")
    for name, secs, mb in rows:
        print(f"| {name} | {secs:.1f} | {mb['VmRSS']:,} | {mb['VmHWM']:,} | {mb['RssAnon']:,} | {mb['RssFile']:,} |")


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    main()
