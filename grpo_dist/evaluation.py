"""Held-out evaluation through the same rollout and reward workers the trainer uses.

Reports sampled accuracy (n samples per prompt at the eval temperature), greedy accuracy,
unbiased pass@k and the mean total reward. Accuracy is the built-in ``correctness`` reward
against the dataset's answer column. The sampling seed is fixed, so "before" and "after" see
the same prompts and the same random stream.
"""

from __future__ import annotations

import time
from typing import Any

from grpo_dist.algo import pass_at_k
from grpo_dist.cluster import dispatch
from grpo_dist.cluster.ray_utils import ActorGroup
from grpo_dist.config import Config
from grpo_dist.reward.builtin import correctness_reward

EVAL_SEED = 1234


def _correct(groups) -> list[list[float]]:
    out = []
    for g in groups:
        comps = [r.completion for r in g.rollouts]
        answers = [r.columns.get("answer") for r in g.rollouts]
        if any(a is None for a in answers):
            raise ValueError("evaluation needs an answer column in the eval dataset (data.answer_column)")
        out.append([float(x) for x in correctness_reward([r.prompt for r in g.rollouts], comps, answer=answers)])
    return out


def evaluate(cfg: Config, rollout: ActorGroup, reward: ActorGroup, records: list[Any],
             with_samples: int = 0) -> dict[str, Any]:
    """Metrics of the policy the rollout workers currently serve, on ``records``."""
    t0 = time.perf_counter()
    n = cfg.eval.samples_per_prompt
    temp = cfg.eval.temperature if cfg.eval.temperature is not None else cfg.rollout.temperature
    groups = dispatch.generate(rollout, records, n=n, temperature=temp, seed=EVAL_SEED)
    correct = _correct(groups)
    scores = dispatch.score(reward, groups)
    flat_correct = [c for row in correct for c in row]
    report: dict[str, Any] = {
        "num_prompts": len(records),
        "samples_per_prompt": n,
        "temperature": temp,
        "sampled_accuracy": sum(flat_correct) / len(flat_correct),
        "mean_reward": sum(scores.total) / len(scores.total),
    }
    for k in cfg.eval.pass_k:
        report[f"pass@{k}"] = sum(pass_at_k(n, int(sum(row)), k) for row in correct) / len(correct)
    if cfg.eval.greedy:
        greedy = dispatch.generate(rollout, records, n=1, temperature=0.0, seed=EVAL_SEED)
        gc = _correct(greedy)
        report["greedy_accuracy"] = sum(row[0] for row in gc) / len(gc)
    report["seconds"] = time.perf_counter() - t0
    if with_samples:
        report["samples"] = [
            {"prompt": g.rollouts[0].prompt, "answer": str(g.rollouts[0].columns.get("answer")),
             "completions": [r.completion for r in g.rollouts], "correct": row}
            for g, row in list(zip(groups, correct))[:with_samples]]
    return report


def eval_metrics(report: dict[str, Any]) -> dict[str, float]:
    """The ``eval/…`` scalars of a report."""
    keys = ["sampled_accuracy", "greedy_accuracy", "mean_reward"] + [k for k in report if k.startswith("pass@")]
    return {f"eval/{k}": float(report[k]) for k in keys if k in report}
