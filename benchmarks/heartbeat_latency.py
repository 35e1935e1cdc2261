"""Benchmark: how fast a rollout actor answers its heartbeat while its engine generates.

    python benchmarks/heartbeat_latency.py [--in-process true|false] [--prompts 64] [--n 8]
        [--max-tokens 32] [--rounds 3]

One vLLM rollout actor (configs/tiny_cpu.yaml's model, built as ``grpo-dist train`` builds it)
generates ``--prompts`` x ``--n`` completions of up to ``--max-tokens`` tokens, ``--rounds`` times,
while the driver asks for a heartbeat every 0.1 s and times each answer. With the engine in the
actor's process (``rollout.engine_in_process``, the CPU default) the heartbeat thread needs the
GIL between vLLM's steps: the largest answer time is what ``cluster.heartbeat_timeout_s`` must
stay well above. Prints the generate times and the heartbeat answer times (median, p99, max).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--in-process", default="true")
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--model", default=None, help="model dir (default: configs/tiny_cpu.yaml's, made if missing)")
    a = ap.parse_args()

    import ray

    from grpo_dist.cluster.ray_utils import init_ray, shutdown_ray
    from grpo_dist.config.load import load_config
    from grpo_dist.data.sources import load_prompts
    from grpo_dist.run.workers import create_generators

    over = {"rollout": {"num_workers": 1, "max_tokens": a.max_tokens, "engine_in_process": a.in_process == "true"},
            "logging": {"wandb_mode": "disabled"}}
    if a.model:
        over["model"] = {"path": a.model, "make_if_missing": None}
    cfg = load_config("configs/tiny_cpu.yaml", over)
    from grpo_dist.run.prepare import prepare_model

    prepare_model(cfg)
    init_ray(cfg)
    try:
        rollout, _ = create_generators(cfg)
        actor = rollout.actors[0]
        print("setup", rollout.get([actor.setup.remote()], timeout=900)[0], flush=True)
        records = load_prompts(cfg.data.path)[: a.prompts]
        for r in range(a.rounds):
            ref = actor.generate.remote(records, n=a.n)
            times, t_gen = [], time.perf_counter()
            while not ray.wait([ref], timeout=0)[0]:
                t0 = time.perf_counter()
                ray.get(actor.heartbeat.remote())
                times.append(time.perf_counter() - t0)
                time.sleep(0.1)
            groups = ray.get(ref)
            gen = time.perf_counter() - t_gen
            times.sort()
            print(f"round {r + 1}: generate {len(groups)} x {a.n} in {gen:.1f} s; {len(times)} heartbeats: median "
                  f"{1e3 * statistics.median(times):.0f} ms, p99 {1e3 * times[int(0.99 * (len(times) - 1))]:.0f} ms, "
                  f"max {1e3 * times[-1]:.0f} ms" if times else f"round {r + 1}: generate in {gen:.1f} s, no heartbeat",
                  flush=True)
        rollout.get(rollout.call("close"), timeout=60)
    finally:
        shutdown_ray()
    sys.exit(0)
