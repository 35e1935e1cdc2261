"""Several adapters on one fleet against one run per adapter (issue 53 item 6).

For each N in ``--ns``: one ``grpo-dist train --sweep learner.lr=<N values>`` (one fleet: one start-up,
one set of engines, one learner holding the base once) against the N single runs of the same
learning rates, the same steps and seeds, one after another. One invocation measures all, on one
machine (its CPU is printed):

* wall: the fleet's process wall time against the sum of the N single runs' (target: N = 4 in at
  most 0.6x);
* completion tokens per second over the whole wall;
* peak memory per role (the largest actor of the role, its engine processes included; the driver):
  the fleet's against one single run's (target: at most 1.3x);
* each adapter's held-out accuracy (sampled and greedy, after training) beside its single run's.

    python benchmarks/multi_lora.py --model tiny --ns 1,2,4 --steps 10 --out benchmarks/results/multi_lora_<date>.json

``--model smollm2`` runs configs/smollm2_cpu.yaml's recipe (pkg:smollm2-135m-instruct) with short steps.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
LRS = ["1e-3", "2e-3", "3e-3", "5e-3", "7e-3", "1e-2"]


def cpu_name() -> str:
    model, flags = "?", set()
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        key, _, val = line.partition(":")
        if key.strip() == "model name" and model == "?":
            model = val.strip()
        elif key.strip() == "flags" and not flags:
            flags = set(val.split())
    units = [f for f in ("avx2", "avx512f", "avx512_bf16", "amx_bf16") if f in flags]
    return f"{model}, {os.cpu_count()} cores, {' '.join(units)}"


def workload(model: str, steps: int) -> list[str]:
    if model == "tiny":
        from grpo_dist.models import make_tiny_model
        from grpo_dist.util.procenv import project_cache

        path = project_cache() / "bench-models" / "tiny-add"
        if not (path / "config.json").exists():
            make_tiny_model(str(path), size="tiny", seed=0, pretrain_task="add", log=None)
        return ["--config", "configs/tiny_cpu.yaml", "--model.path", str(path), "--rollout.num_workers", "1",
                "--trainer.steps", str(steps), "--data.eval_size", "64", "--eval.samples_per_prompt", "1",
                "--eval.pass_k", "[1]", "--checkpoint.every", "0", "--logging.sample_table_every", "0",
                "--logging.wandb_mode", "offline"]
    return ["--config", "configs/smollm2_cpu.yaml", "--trainer.steps", str(steps),
            "--data.path", "builtin:word_problems?difficulty=1&instruction=varied", "--rollout.max_tokens", "96",
            "--rollout.prompts_per_step", "4", "--learner.warmup_steps", "1", "--data.eval_size", "32",
            "--eval.samples_per_prompt", "1", "--eval.pass_k", "[1]", "--eval.extra", "{}",
            "--checkpoint.every", "0", "--logging.sample_table_every", "0"]


def run(args: list[str], out: Path) -> dict:
    """One ``grpo-dist train``: its wall, exit code and what it wrote."""
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, "-m", "grpo_dist.cli", "train", *args, "--output_dir", str(out)],
                       cwd=ROOT, capture_output=True, text=True, env={**os.environ, "GRPO_DIST_EVAL_CACHE": "off"})
    wall = time.perf_counter() - t0
    if p.returncode != 0:
        raise SystemExit(f"{out}: exit {p.returncode}\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}")
    return {"wall": wall, "summary": json.loads((out / "summary.json").read_text())}


def tokens(run_dir: Path) -> float:
    """Completion tokens the run generated for training (the per-step throughput times the step)."""
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return sum(r["perf/tokens_per_s"] * r["timing/step"] for r in rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", choices=["tiny", "smollm2"], default="tiny")
    ap.add_argument("--ns", default="1,2,4")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--work", default="/tmp/multi_lora_bench")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    ns = [int(x) for x in a.ns.split(",")]
    base, work = workload(a.model, a.steps), Path(a.work)
    print(f"CPU: {cpu_name()}; model {a.model}; {a.steps} steps", flush=True)
    singles: dict[str, dict] = {}
    for lr in LRS[:max(ns)]:
        singles[lr] = run(base + ["--learner.lr", lr], work / f"single_lr{lr}")
        singles[lr]["tokens"] = tokens(work / f"single_lr{lr}")
        print(f"single lr {lr}: {singles[lr]['wall']:.0f} s", flush=True)
    rows = []
    for n in ns:
        lrs = LRS[:n]
        d = work / f"fleet{n}"
        fleet = run(base + ["--sweep", "learner.lr=" + ",".join(lrs)], d)
        names = [f"learner.lr={lr}" for lr in lrs]
        fleet_tokens = sum(tokens(d / "adapters" / name) for name in names)
        single_wall = sum(singles[lr]["wall"] for lr in lrs)
        single_tokens = sum(singles[lr]["tokens"] for lr in lrs)
        peak_single = {role: max(singles[lr]["summary"]["peak_rss_gib"].get(role, 0.0) for lr in lrs)
                       for role in ("learner", "rollout", "reward", "driver")}
        peak_fleet = fleet["summary"]["peak_rss_gib"]
        acc = {lr: (json.loads((d / "adapters" / f"learner.lr={lr}" / "summary.json").read_text()),
                    singles[lr]["summary"]) for lr in lrs}
        rows.append({"n": n, "fleet_wall": fleet["wall"], "singles_wall": single_wall,
                     "wall_ratio": fleet["wall"] / single_wall, "fleet_tokens_per_s": fleet_tokens / fleet["wall"],
                     "singles_tokens_per_s": single_tokens / single_wall,
                     "peak_gib": {role: [peak_fleet.get(role), peak_single[role]] for role in peak_single},
                     "memory_ratio": max(peak_fleet.get(r, 0.0) / peak_single[r] for r in ("learner", "rollout")
                                         if peak_single[r]),
                     "accuracy": {lr: {k: [m.get(k), s.get(k)] for k in ("sampled_accuracy_after",
                                                                          "greedy_accuracy_after")}
                                  for lr, (m, s) in acc.items()},
                     "startup_s": fleet["summary"]["startup"].get("startup/actors_s")})
        print(json.dumps(rows[-1]), flush=True)
    print(f"\nCPU: {cpu_name()}; model {a.model}; {a.steps} steps per adapter\n")
    print("| N | fleet wall s | N single runs s | ratio | tokens/s fleet / singles | peak GiB learner fleet / single "
          "| rollout fleet / single | memory ratio |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        pk = r["peak_gib"]
        print(f"| {r['n']} | {r['fleet_wall']:.0f} | {r['singles_wall']:.0f} | **{r['wall_ratio']:.2f}x** | "
              f"{r['fleet_tokens_per_s']:.0f} / {r['singles_tokens_per_s']:.0f} | {pk['learner'][0]:.2f} / "
              f"{pk['learner'][1]:.2f} | {pk['rollout'][0]:.2f} / {pk['rollout'][1]:.2f} | {r['memory_ratio']:.2f}x |")
    print("\n| N | lr | sampled acc after: adapter / single | greedy acc after: adapter / single |")
    print("|---|---|---|---|")
    for r in rows:
        for lr, accs in r["accuracy"].items():
            s, g = accs["sampled_accuracy_after"], accs["greedy_accuracy_after"]
            print(f"| {r['n']} | {lr} | {s[0]:.3f} / {s[1]:.3f} | {g[0]:.3f} / {g[1]:.3f} |")
    if a.out:
        Path(a.out).write_text(json.dumps({"cpu": cpu_name(), "model": a.model, "steps": a.steps, "rows": rows,
                                           "date": time.strftime("%Y-%m-%d")}, indent=1))


if __name__ == "__main__":
    main()
