"""Multi-turn rollout throughput: lock-step turns (the batch worker, what TRL's tool loop does)
against one coroutine per trajectory on vLLM's async engine, same model, prompts, seeds and
environment, one invocation.

    python benchmarks/env_throughput.py --model DIR [--prompts 8 --group 4 --max-turns 4 \
        --max-tokens 16 --latency 0.5]
    python benchmarks/env_throughput.py --env calculator --model .cache/models/smollm2-135m-instruct-0.1.2 \
        --prompts 8 --group 8 --max-turns 3 --max-tokens 48 --max-model-len 1024

The environment (:class:`LatencyTool`) answers each turn like a tool that takes a while: it awaits
a seeded random latency (exponential, mean ``--latency`` s; a tool in another process or actor
does not hold the engine) and ends each trajectory after a seeded number of turns (1..max_turns),
so trajectories differ in length and wait. Prints one JSON line: trajectories/s and sampled
tokens/s of each mode, their ratio, and whether both sampled the same tokens (they must: same
seeds per turn).
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import random
import time
from pathlib import Path

from grpo_dist.envs.base import EnvStep


class LatencyTool:
    """A scripted tool environment with seeded latencies and trajectory lengths."""

    def __init__(self, latency: float = 0.5, max_turns: int = 4):
        self.latency, self.max_turns = latency, max_turns

    def reset(self, record):
        self.n, self.key = 0, record.prompt
        return None

    async def step(self, completion: str) -> EnvStep:
        self.n += 1
        rng = random.Random(int.from_bytes(hashlib.sha1(f"{self.key}|{completion}|{self.n}".encode()).digest()[:8], "big"))
        await asyncio.sleep(rng.expovariate(1.0 / self.latency) if self.latency > 0 else 0.0)
        if self.n >= rng.randint(1, self.max_turns):
            return EnvStep(done=True, reward=1.0)
        return EnvStep([{"role": "tool", "content": f"result {rng.randint(0, 999)}"}], info={"tool_calls": 1})


def config(args):
    from grpo_dist.config import load_config

    if args.env == "calculator":  # the real environment: its tool answers at once
        env = {"env": "calculator", "env_kwargs": {"few_shot": True}, "temperature": args.temperature}
    else:
        env = {"env": f"{Path(__file__).resolve()}:LatencyTool",
               "env_kwargs": {"latency": args.latency, "max_turns": args.max_turns}}
    return load_config(None, {
        "model": {"path": args.model, "max_model_len": args.max_model_len}, "lora": {"enabled": False},
        "rollout": {"backend": "vllm", "group_size": args.group, "max_tokens": args.max_tokens,
                    "max_turns": args.max_turns, **env}})


def records(args):
    from grpo_dist.data import make_task

    if args.env == "calculator":
        return make_task("tool_problems", args.prompts, seed=3, split="eval")
    return make_task("add", args.prompts, seed=3, split="eval")


def lock_step(args) -> tuple[list, float]:
    from grpo_dist.rollout.worker import RolloutWorker

    w = RolloutWorker(config(args))
    w.setup()
    recs = records(args)
    w.generate(recs[:1], keys=[(9, 9, 0)])  # warm-up
    t0 = time.perf_counter()
    groups = w.generate(recs, keys=[(0, 1, i) for i in range(len(recs))])
    wall = time.perf_counter() - t0
    w.close()
    return groups, wall


def per_trajectory(args) -> tuple[list, float]:
    from grpo_dist.rollout.stream_worker import StreamingRolloutWorker

    cfg = config(args)
    cfg.rollout.streaming = True

    async def main():
        w = StreamingRolloutWorker(cfg)
        w.setup()
        recs = records(args)
        await w.generate(recs[:1], keys=[(9, 9, 0)])  # warm-up
        t0 = time.perf_counter()
        groups = await w.generate(recs, keys=[(0, 1, i) for i in range(len(recs))])
        wall = time.perf_counter() - t0
        w.close()
        return groups, wall

    return asyncio.run(main())


def summary(groups, wall: float) -> dict:
    rs = [r for g in groups for r in g.rollouts]
    sampled = sum(sum(r.loss_mask) for r in rs)
    return {"wall_s": round(wall, 2), "trajectories": len(rs), "turns": sum(r.turns for r in rs),
            "sampled_tokens": sampled, "trajectories_per_s": round(len(rs) / wall, 3),
            "sampled_tokens_per_s": round(sampled / wall, 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--group", type=int, default=4)
    ap.add_argument("--max-turns", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--max-model-len", type=int, default=256)
    ap.add_argument("--latency", type=float, default=0.5, help="latency env: the tool's mean seconds")
    ap.add_argument("--env", choices=["latency", "calculator"], default="latency",
                    help="latency: the scripted tool above; calculator: the built-in calculator environment "
                         "(few_shot) on builtin:tool_problems, e.g. with SmolLM2-135M-Instruct")
    ap.add_argument("--temperature", type=float, default=0.7, help="calculator env: sampling temperature")
    args = ap.parse_args()
    a_groups, a_wall = lock_step(args)
    b_groups, b_wall = per_trajectory(args)
    same = all(x.completion_ids == y.completion_ids and x.loss_mask == y.loss_mask
               for ga, gb in zip(a_groups, b_groups) for x, y in zip(ga.rollouts, gb.rollouts))
    a, b = summary(a_groups, a_wall), summary(b_groups, b_wall)
    print("ENV_THROUGHPUT " + json.dumps({
        "args": vars(args), "lock_step": a, "per_trajectory": b, "same_tokens": same,
        "trajectories_per_s_ratio": round(b["trajectories_per_s"] / a["trajectories_per_s"], 3)}), flush=True)


if __name__ == "__main__":
    main()
