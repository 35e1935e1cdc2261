"""In-flight weight updates against draining and the batch pipeline, on a long-tail workload (issue 44 item 5).

One vLLM async engine (``AsyncVLLMGenerator``, the streaming pipeline's) on the tiny model; each
group's completions are short (``--short`` tokens) or, for a fraction ``--long-frac``, long
(``--long`` tokens): the longest group of a step sets the pace of a step that waits for it. The
learner is a timer (``--learn-s`` seconds per update, on no core): this measures the engine-side
schedule as it runs where engines and learner have devices of their own (GPUs); on a 2-core CPU
machine a real learner takes the engine's cores while it trains, which no schedule hides.

Modes, ``--steps`` steps of ``--prompts`` groups of ``--group`` samples each:

* ``batch``: generate a step's groups, wait for all, "learn", load (drained: nothing runs).
* ``drain``: streaming, one step ahead (k = 1): the next step's groups are submitted before the
  update; the load waits for the running groups (new ones wait meanwhile).
* ``inflight``: as drain, the load pauses the engine with its requests kept (recompute).

Per mode: samples/s over the run, the learner's wait for its batches (seconds per step), the
engine's idle time around a load (batch: the update and the load, when nothing is generated;
drain: the load call's wall, during which no new group starts; in-flight: the pause), and the
share of samples whose tokens span two versions. One invocation prints one table (markdown)::

    python benchmarks/inflight_bench.py --out benchmarks/results/inflight_<date>.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def models(work: Path) -> tuple[Path, Path]:
    """The tiny model and a perturbed copy (the 'new version' each load alternates to)."""
    import safetensors.torch as st
    import torch

    from grpo_dist.models import make_tiny_model

    a, b = work / "v0", work / "v1"
    if not (a / "config.json").exists():
        make_tiny_model(a, size="tiny", seed=0, log=lambda *x, **k: None)
    if not b.exists():
        shutil.copytree(a, b)
        f = next(b.glob("*.safetensors"))
        g = torch.Generator().manual_seed(1)
        st.save_file({k: v + 0.02 * torch.randn(v.shape, generator=g, dtype=v.dtype)
                      for k, v in st.load_file(f).items()}, f, metadata={"format": "pt"})
    return a, b


async def run_mode(engine, mode: str, args, paths) -> dict:
    from grpo_dist.rollout.base import SamplingSpec

    rng = random.Random(0)
    specs = [[SamplingSpec(n=args.group, temperature=1.0, max_tokens=args.long if rng.random() < args.long_frac
                           else args.short) for _ in range(args.prompts)] for _ in range(args.steps + 1)]
    engine.inflight = "recompute" if mode == "inflight" else None
    engine.loads = []
    seed = iter(range(10**6))

    def submit(step):
        return [asyncio.create_task(engine.generate_group([1, 5, 6, 7], s, [next(seed) for _ in range(s.n)]))
                for s in specs[step]]

    idle, waits, samples, mixed = [], [], 0, 0
    t0 = time.perf_counter()
    ahead = submit(0) if mode != "batch" else None
    for step in range(args.steps):
        tw = time.perf_counter()
        groups = await asyncio.gather(*(ahead if ahead is not None else submit(step)))
        waits.append(time.perf_counter() - tw)
        samples += sum(len(g[0]) for g in groups)
        mixed += sum(len(set(s.versions)) > 1 for g in groups for s in g[0] if s.versions)
        if mode != "batch":
            ahead = submit(step + 1)  # the next step's groups generate while the learner trains
        tl = time.perf_counter()
        await asyncio.sleep(args.learn_s)  # the update
        t1 = time.perf_counter()
        await engine.load_full_weights(str(paths[(step + 1) % 2]), engine.version + 1)
        t2 = time.perf_counter()
        idle.append(t2 - tl if mode == "batch" else t2 - t1)
    if ahead is not None:  # the groups generated ahead: not counted
        await asyncio.gather(*ahead)
    wall = time.perf_counter() - t0
    paused = [x["paused_s"] for x in engine.loads]
    return {"mode": mode, "wall_s": wall, "samples": samples, "samples_per_s": samples / wall,
            "learner_wait_s_mean": sum(waits) / len(waits), "learner_wait_s_max": max(waits),
            "engine_idle_around_load_s_mean": sum(paused or idle) / len(idle),
            "mixed_version_frac": mixed / samples}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--group", type=int, default=4)
    p.add_argument("--short", type=int, default=16)
    p.add_argument("--long", type=int, default=224)
    p.add_argument("--long-frac", type=float, default=0.125)
    p.add_argument("--learn-s", type=float, default=1.0)
    p.add_argument("--work", default="/tmp/inflight_bench")
    p.add_argument("--out", default=None)
    args = p.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from grpo_dist.rollout.async_vllm import AsyncVLLMGenerator

    paths = models(Path(args.work))
    engine = AsyncVLLMGenerator(str(paths[0]), enable_lora=False, inflight="recompute", max_model_len=256,
                                cpu_kvcache_gb=0.5)
    cpu = next((ln.split(":", 1)[1].strip() for ln in subprocess.run(["lscpu"], capture_output=True, text=True)
                .stdout.splitlines() if ln.startswith("Model name")), "?")

    async def all_modes():
        from grpo_dist.rollout.base import SamplingSpec

        await engine.generate_group([1, 5, 6, 7], SamplingSpec(n=2, max_tokens=8), [0, 1])  # warm
        return [await run_mode(engine, m, args, paths) for m in ("batch", "drain", "inflight")]

    try:
        rows = asyncio.run(all_modes())
    finally:
        engine.close()
    load = os.getloadavg()
    print(f"CPU: {cpu}; {os.cpu_count()} CPUs; load average {load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f}; "
          f"args {vars(args)}")
    print("| mode | samples/s | learner wait s (mean / max) | new groups held back per load s | mixed-version samples |")
    print("|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['mode']} | {r['samples_per_s']:.1f} | {r['learner_wait_s_mean']:.2f} / {r['learner_wait_s_max']:.2f} "
              f"| {r['engine_idle_around_load_s_mean']:.2f} | {r['mixed_version_frac']:.2f} |")
    if args.out:
        Path(args.out).write_text(json.dumps({"cpu": cpu, "loadavg": load, "args": vars(args), "rows": rows}, indent=1))
    os._exit(0)  # vLLM's async engine threads


if __name__ == "__main__":
    main()
