"""Benchmark: the whole pipeline for several ``trainer.max_staleness`` values (0 = on-policy).

    python benchmarks/pipeline.py [--config configs/tiny_cpu.yaml --steps 30 --skip 5]
        [--trainer.max_staleness 0,1,2] [--json out.json] [--key VALUE ...]

Runs the trainer once per k on the same config (real Ray, vLLM, DeepSpeed; W&B disabled, no
evaluation, no checkpoints) and prints the mean seconds per step of each phase over the steps
after the first ``--skip`` (engine warm-up), completion tokens per second, and the reward of the
last 5 steps, as a table and as JSON. Extra ``--section.key VALUE`` pairs override the config
for every run. With k >= 1 the step time should approach max(generate, learn + sync) instead of
their sum; ``generate_wait`` is the generation the update did not hide (``generate`` is what ran
on-policy: every step with k = 0, the first step and dynamic-sampling refills otherwise).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PHASES = ["timing/step", "timing/generate", "timing/generate_wait", "timing/score", "timing/learn", "timing/sync"]


def run(config: str, steps: int, skip: int, max_staleness: int, extra: list[str]) -> dict[str, float]:
    from grpo_dist.config import load_config
    from grpo_dist.trainer import Trainer

    out = tempfile.mkdtemp(prefix="grpo_bench_")
    cfg = load_config(config, extra + [
        "--output_dir", out, "--trainer.steps", str(steps), "--trainer.max_staleness", str(max_staleness),
        "--trainer.eval_before_after", "false", "--trainer.eval_every", "0", "--checkpoint.every", "0",
        "--logging.wandb_mode", "disabled", "--logging.progress", "false", "--logging.sample_table_every", "0"])
    trainer = Trainer(cfg)
    try:
        trainer.setup()
        t0 = time.perf_counter()
        trainer.run()
        wall = time.perf_counter() - t0
    finally:
        trainer.close()
    hist = trainer.history[skip:]
    res = {k: sum(h.get(k, 0.0) for h in hist) / len(hist) for k in PHASES}
    res["perf/tokens_per_s"] = sum(h["perf/tokens_per_s"] for h in hist) / len(hist)
    res["reward_last5"] = sum(h["rollout/reward_mean"] for h in trainer.history[-5:]) / 5
    res["wall_run_s"] = wall
    return res


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default=os.path.join(ROOT, "configs", "tiny_cpu.yaml"))
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--skip", type=int, default=5, help="warm-up steps left out of the means")
    ap.add_argument("--trainer.max_staleness", dest="ks", default="0,1,2",
                    help="comma-separated values of trainer.max_staleness, one run each")
    ap.add_argument("--json", default=None, help="also write the results to this file")
    args, extra = ap.parse_known_args(argv)
    if args.skip >= args.steps:
        ap.error("--skip must be smaller than --steps")
    ks = [int(k) for k in args.ks.split(",")]
    from grpo_dist.env import setup_env

    setup_env()
    rows = {k: run(args.config, args.steps, args.skip, k, extra) for k in ks}
    cols = PHASES + ["perf/tokens_per_s", "reward_last5", "wall_run_s"]
    print(f"\n{args.steps} steps of {os.path.relpath(args.config, ROOT)} {' '.join(extra)} "
          f"(means over steps {args.skip + 1}-{args.steps}; times in s)")
    print("| max_staleness | " + " | ".join(c.split("/")[-1] for c in cols) + " |")
    print("|---" * (len(cols) + 1) + "|")
    for k, r in rows.items():
        print(f"| {k} | " + " | ".join(f"{r[c]:.3f}" for c in cols) + " |")
    base = rows[ks[0]]["timing/step"]
    for k in ks[1:]:
        print(f"k={k}: step time {rows[k]['timing/step'] / base:.2f}x k={ks[0]} ({base:.3f} s -> "
              f"{rows[k]['timing/step']:.3f} s)")
    doc = {"config": os.path.relpath(args.config, ROOT), "steps": args.steps, "skip": args.skip, "extra": extra,
           "results": {str(k): r for k, r in rows.items()}}
    print(json.dumps(doc, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
