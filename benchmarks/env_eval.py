"""Held-out numbers of a multi-turn environment on a model, no training: accuracy (the
environment's reward), the rate of well-formed tool calls, turns, stop reasons, tokens/s.

    python benchmarks/env_eval.py --config configs/calculator_smollm2.yaml \
        --model /path/to/smollm2 --problems 128 --samples 4 [--adapter DIR] [--backend hf]

One in-process rollout worker (the config's engine), the config's environment and limits, the
held-out split of ``data.eval_path``; seeded. Prints one JSON line.
"""

from __future__ import annotations

import argparse
import collections
import json
import time


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", required=True)
    ap.add_argument("--model", help="model.path override")
    ap.add_argument("--adapter", help="a PEFT adapter directory to serve (default: the base model)")
    ap.add_argument("--backend", choices=["vllm", "hf"], help="rollout.backend override")
    ap.add_argument("--problems", type=int, default=128)
    ap.add_argument("--samples", type=int, default=4)
    ap.add_argument("--temperature", type=float, default=None)
    ap.add_argument("--show", type=int, default=0, help="print this many whole trajectories (stderr)")
    args = ap.parse_args()

    from grpo_dist.config import load_config
    from grpo_dist.data import load_prompts
    from grpo_dist.rollout.worker import RolloutWorker

    over: dict = {"rollout": {"num_workers": 1}}
    if args.model:
        over["model"] = {"path": args.model}
    if args.backend:
        over["rollout"]["backend"] = args.backend
    cfg = load_config(args.config, over)
    records = load_prompts(cfg.data.eval_path or cfg.data.path, split="eval", limit=args.problems)
    w = RolloutWorker(cfg)
    w.setup()
    if args.adapter:
        w.load_adapter_dir(args.adapter, 1)
    t0 = time.perf_counter()
    groups = w.generate(records, n=args.samples, temperature=args.temperature, seed=1234)
    wall = time.perf_counter() - t0
    tok = w.engine.tokenizer
    w.close()
    rs = [r for g in groups for r in g.rollouts]
    for r in rs[:args.show]:
        import sys

        print(f"--- {r.stop_reason}, turns {r.turns}, reward {r.columns.get('env_reward')}\n"
              f"{tok.decode(r.prompt_ids + r.completion_ids)}", file=sys.stderr)
    col = lambda k: [r.columns.get(k) or 0 for r in rs]  # noqa: E731
    calls, malformed = sum(col("tool_calls")), sum(col("tool_malformed"))
    sampled = sum(sum(r.loss_mask) for r in rs)
    out = {
        "model": cfg.model.path, "adapter": args.adapter, "env": cfg.rollout.env, "problems": len(records),
        "samples": args.samples, "trajectories": len(rs),
        "accuracy": sum(1 for r in rs if (r.columns.get("env_reward") or 0) > 0) / len(rs),
        "pass_at_k": sum(any((r.columns.get("env_reward") or 0) > 0 for r in g.rollouts) for g in groups) / len(groups),
        "tool_calls_per_trajectory": calls / len(rs),
        "trajectories_with_a_call": sum(1 for c in col("tool_calls") if c) / len(rs),
        "well_formed_call_rate": (calls - malformed) / calls if calls else None,
        "tool_errors": sum(col("tool_errors")), "tool_timeouts": sum(col("tool_timeouts")),
        "turns_mean": sum(r.turns for r in rs) / len(rs),
        "stop_reasons": dict(collections.Counter(r.stop_reason for r in rs)),
        "sampled_tokens": sampled, "wall_s": round(wall, 1), "sampled_tokens_per_s": round(sampled / wall, 1),
        "trajectories_per_s": round(len(rs) / wall, 3),
    }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
