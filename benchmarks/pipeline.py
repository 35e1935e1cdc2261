"""Benchmark: the whole pipeline over a grid of models, worker counts, staleness bounds and adapter modes.

    python benchmarks/pipeline.py [--models tiny,small] [--workers 1,2] [--ks 0,1,2]
        [--adapter-modes merged] [--steps 20] [--skip 5] [--json out.json] [--section.key VALUE ...]

Each grid point is one trainer run (real local Ray cluster, vLLM, DeepSpeed; W&B disabled, no
evaluation, no checkpoints) on the same config; extra ``--section.key VALUE`` pairs override it
for every run. Prints, per run, the mean seconds per step of each phase over the steps after the
first ``--skip`` (engine warm-up), completions and completion tokens per second, the driver's
overhead (the step minus the phases it waited on: generate, generate_wait, score, learn, sync)
and the reward of the last 5 steps, as a markdown table, then the ratios (async vs sync, merged vs
lora) and the machine's CPU model and flags; the same as JSON. With k >= 1 the step time should
approach max(generate, learn + sync) instead of their sum; ``generate_wait`` is the generation the
update did not hide.

Models: ``tiny`` = the demo (configs/tiny_cpu.yaml: 16 prompts x 8, 6 tokens, LoRA r=16 on every
projection); ``small`` = the TRL comparison's workload: a generated 25M-parameter Llama (hidden 512, 8 layers,
untrained: throughput only), 8 prompts x 8 completions, 32 new tokens, LoRA r=8 on q,k,v,o, beta
0.04, lr 1e-4, one 64-completion micro-batch.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PHASES = ["timing/step", "timing/generate", "timing/generate_wait", "timing/score", "timing/learn", "timing/sync"]
SMALL_MODEL = os.path.join(ROOT, ".cache", "bench-models", "small-untrained")
MODELS = {
    "tiny": [],
    "small": ["--model.path", SMALL_MODEL, "--model.make_if_missing", '{"size": "small", "pretrain_task": null}',
              "--model.max_model_len", "128", "--lora.r", "8", "--lora.alpha", "16",
              "--lora.target_modules", '["q_proj", "k_proj", "v_proj", "o_proj"]', "--rollout.prompts_per_step", "8",
              "--rollout.group_size", "8", "--rollout.max_tokens", "32", "--algo.beta", "0.04",
              "--learner.lr", "1e-4", "--learner.warmup_steps", "0", "--learner.micro_batch_size", "64",
              "--cluster.torch_threads", "auto"],  # the default (configs/tiny_cpu.yaml pins 1 for the demo)
}


def cpu_line() -> str:
    model, flags = platform.processor() or "?", set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name") and model in ("?", "", "x86_64"):
                    model = line.split(":", 1)[1].strip()
                if line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
    except OSError:
        pass
    isa = [f for f in ("avx2", "avx512f", "avx512_bf16", "amx_tile") if f in flags]
    return f"{model}, {os.cpu_count()} cores, {' '.join(isa) or 'no avx2'}"


def run(config: str, steps: int, skip: int, overrides: list[str]) -> dict[str, float]:
    from grpo_dist.config import load_config
    from grpo_dist.run.run import Run
    from grpo_dist.train import train

    out = tempfile.mkdtemp(prefix="grpo_bench_")
    cfg = load_config(config, overrides + [
        "--output_dir", out, "--trainer.steps", str(steps),
        "--trainer.eval_before_after", "false", "--trainer.eval_every", "0", "--checkpoint.every", "0",
        "--logging.wandb_mode", "disabled", "--logging.progress", "false", "--logging.sample_table_every", "0"])
    trainer = Run(cfg)
    try:
        trainer.start()
        t0 = time.perf_counter()
        train(trainer)
        wall = time.perf_counter() - t0
    finally:
        trainer.close()
        from grpo_dist.cluster.ray_utils import shutdown_ray

        shutdown_ray()  # a fresh cluster per run: actors with other settings
    hist = trainer.history[skip:]
    res = {k: sum(h.get(k, 0.0) for h in hist) / len(hist) for k in PHASES}
    res["overhead"] = res["timing/step"] - sum(res[k] for k in PHASES[1:])
    res["overhead_frac"] = res["overhead"] / res["timing/step"]
    n = cfg.rollout.prompts_per_step * cfg.rollout.group_size
    res["completions_per_s"] = n / res["timing/step"]
    res["perf/tokens_per_s"] = sum(h["perf/tokens_per_s"] for h in hist) / len(hist)
    res["reward_last5"] = sum(h["rollout/reward_mean"] for h in trainer.history[-5:]) / min(5, len(trainer.history))
    res["wall_run_s"] = wall
    return res


COLS = PHASES + ["overhead", "overhead_frac", "completions_per_s", "perf/tokens_per_s", "reward_last5"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n\n", 2)[2])
    ap.add_argument("--config", default=os.path.join(ROOT, "configs", "tiny_cpu.yaml"))
    ap.add_argument("--models", default="tiny", help="comma-separated: tiny, small")
    ap.add_argument("--workers", default="1", help="comma-separated rollout.num_workers values")
    ap.add_argument("--ks", "--trainer.max_staleness", dest="ks", default="0,1,2",
                    help="comma-separated trainer.max_staleness values")
    ap.add_argument("--adapter-modes", default="merged", help="comma-separated rollout.adapter_mode values")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--skip", type=int, default=5, help="warm-up steps left out of the means")
    ap.add_argument("--json", default=None, help="also write the results to this file")
    args, extra = ap.parse_known_args(argv)
    if args.skip >= args.steps:
        ap.error("--skip must be smaller than --steps")
    models = args.models.split(",")
    for m in models:
        if m not in MODELS:
            ap.error(f"--models: unknown {m!r} (tiny, small)")
    from grpo_dist.util.procenv import setup_env

    setup_env()
    grid = list(itertools.product(models, [int(w) for w in args.workers.split(",")],
                                  args.adapter_modes.split(","), [int(k) for k in args.ks.split(",")]))
    rows = []
    for model, workers, mode, k in grid:
        over = MODELS[model] + ["--rollout.num_workers", str(workers), "--rollout.adapter_mode", mode,
                                "--trainer.max_staleness", str(k)] + extra
        print(f"== {model} workers={workers} adapter_mode={mode} max_staleness={k}", flush=True)
        rows.append({"model": model, "workers": workers, "adapter_mode": mode, "k": k,
                     **run(args.config, args.steps, args.skip, over)})
    cpu = cpu_line()
    print(f"\n{args.steps} steps per run, means over steps {args.skip + 1}-{args.steps}; times in s; {cpu}; "
          f"extra: {' '.join(extra) or '-'}")
    print("| model | workers | adapter | k | " + " | ".join(c.split("/")[-1] for c in COLS) + " |")
    print("|---" * (len(COLS) + 4) + "|")
    for r in rows:
        print(f"| {r['model']} | {r['workers']} | {r['adapter_mode']} | {r['k']} | "
              + " | ".join(f"{r[c]:.3f}" for c in COLS) + " |")
    ratios = []
    for r in rows:
        for base in rows:
            same = all(r[f] == base[f] for f in ("model", "workers", "adapter_mode"))
            if same and base["k"] == 0 and r["k"] > 0:
                ratios.append(f"{r['model']}, {r['workers']} worker(s), {r['adapter_mode']}: k={r['k']} step "
                              f"{r['timing/step'] / base['timing/step']:.2f}x k=0")
            same = all(r[f] == base[f] for f in ("model", "workers", "k"))
            if same and base["adapter_mode"] == "lora" and r["adapter_mode"] == "merged":
                ratios.append(f"{r['model']}, {r['workers']} worker(s), k={r['k']}: merged step "
                              f"{r['timing/step'] / base['timing/step']:.2f}x lora (generate "
                              f"{r['timing/generate'] + r['timing/generate_wait']:.3f} vs "
                              f"{base['timing/generate'] + base['timing/generate_wait']:.3f} s)")
    print("\n".join(ratios))
    doc = {"cpu": cpu, "steps": args.steps, "skip": args.skip, "extra": extra, "rows": rows, "ratios": ratios,
           "date": time.strftime("%Y-%m-%d %H:%M"), "load": os.getloadavg()}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
