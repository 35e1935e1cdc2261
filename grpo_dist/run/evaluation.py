"""Held-out evaluation through the same rollout and reward workers training uses.

The eval set follows the data (``data.eval_path: auto``, see :mod:`grpo_dist.data.heldout`) and
is scored with the configured reward functions:

* every configured reward whose dataset columns the eval set has is scored and reported
  (``reward_means``, ``mean_reward`` = the weighted total, as in training);
* rewards that need a column the eval set lacks (``correctness`` and ``math`` need ``answer``)
  are skipped; the report's ``rewards_skipped`` and a log line say which and why;
* accuracy comes from the rewards that check a reference column (``accuracy_rewards``): a
  completion is correct when each of them gives it at least 1.0 (``correctness`` and ``math``
  give 1.0 for a match). Then the report has sampled accuracy (n samples per prompt at the eval
  temperature), greedy accuracy and unbiased pass@k; without such a reward, only the rewards.

The sampling seed is fixed, so "before" and "after" see the same prompts and the same random
stream. ``eval.extra`` names more held-out sets (e.g. problems phrased another way than the
training data, ``builtin:word_problems_ood``); :func:`evaluate_sets` evaluates each the same way
and nests its report under ``extra``; their scalars are ``eval/<set>/…``.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any, Callable

from grpo_dist.config import Config
from grpo_dist.reward.columns import EvalPlan, check_rewards, plan_eval
from grpo_dist.reward.failures import whole_batch_failures

if TYPE_CHECKING:
    from grpo_dist.cluster.ray_utils import ActorGroup

EVAL_SEED = 1234
CORRECT_AT = 1.0  # a reference-checking reward at or above this marks a completion correct
PHASE_LINE_AFTER_S = 30.0  # a one-set evaluation says "sampled done, greedy next" only when it is slow

log = logging.getLogger("grpo_dist.run.evaluation")
_said: set[str] = set()


def summarise(plan: EvalPlan, groups: list[Any], scores: Any) -> tuple[dict[str, Any], list[list[float]] | None]:
    """Report fields of one generation pass (``groups`` scored as ``scores``, a RewardResult over
    ``plan.used``) and the per-group correctness (None without accuracy rewards)."""
    n = len(scores.total)
    applicable = {k: [x for x in v if x is not None] for k, v in scores.per_function.items()}  # None: not applicable
    out: dict[str, Any] = {"mean_reward": sum(scores.total) / n if n else 0.0,
                           "reward_means": {k: sum(v) / len(v) for k, v in applicable.items() if v}}
    errors = {k: v for k, v in scores.errors.items() if v}
    if errors:
        out["reward_errors"] = errors
    if plan.accuracy:
        flat = [float(all((scores.per_function[a][i] or 0.0) >= CORRECT_AT for a in plan.accuracy)) for i in range(n)]
    elif env_scored(groups):  # multi-turn: the environment's own reward (e.g. the calculator's answer check)
        flat = [float((r.columns.get("env_reward") or 0.0) >= CORRECT_AT) for g in groups for r in g.rollouts]
    else:
        return out, None
    correct, i = [], 0
    for g in groups:
        correct.append(flat[i:i + len(g.rollouts)])
        i += len(g.rollouts)
    out["accuracy"] = sum(flat) / n if n else 0.0
    return out, correct


def env_scored(groups: list[Any]) -> bool:
    """Multi-turn trajectories whose environment gave a reward (the ``env_reward`` column)."""
    return any(r.loss_mask is not None and r.columns.get("env_reward") is not None for g in groups for r in g.rollouts)


TOOL_USE = ("turns_mean", "tool_calls_mean", "tool_use_frac", "tool_call_ok_frac", "tool_errors_mean", "tool_error_frac")


def tool_use(groups: list[Any]) -> dict[str, Any]:
    """Multi-turn (environment) rollouts: turns and tool calls per trajectory, the fraction of
    trajectories with a tool call, tool errors, why trajectories stopped; {} for single-turn."""
    from grpo_dist.batch import trajectory_metrics

    flat = [r for g in groups for r in g.rollouts]
    if not flat or not any(r.loss_mask is not None for r in flat):
        return {}
    m = {k.split("/", 1)[1]: v for k, v in trajectory_metrics(flat, [len(r.completion_ids) for r in flat]).items()}
    out: dict[str, Any] = {k: m[k] for k in TOOL_USE if k in m}
    out.setdefault("tool_calls_mean", 0.0)
    out["tool_use_frac"] = sum(int(r.columns.get("tool_calls") or 0) > 0 for r in flat) / len(flat)
    if m.get("tool_calls"):  # the calls that parsed, named a known tool with good arguments and ran without error
        out["tool_call_ok_frac"] = 1.0 - m["tool_error_frac"]
    out["stop_reasons"] = {k.split("/", 1)[1]: int(v) for k, v in m.items() if k.startswith("stop_reason/")}
    return out


def _say_once(msg: str | None) -> None:
    if msg and msg not in _said:
        _said.add(msg)
        log.warning(msg)


def evaluate(cfg: Config, rollout: "ActorGroup", reward: "ActorGroup", records: list[Any],
             with_samples: int = 0, progress: Callable[[str], None] | None = None,
             label: str = "held-out", phase_line_after_s: float = 0.0) -> dict[str, Any]:
    """Metrics of the policy the rollout workers currently serve, on ``records``; ``progress``
    gets a line after the sampled phase of the set ``label`` when it took ``phase_line_after_s``
    or longer: a base model's long answers make an evaluation take many minutes."""
    from grpo_dist.algo import pass_at_k
    from grpo_dist.orchestrator import dispatch

    t0 = time.perf_counter()
    plan = plan_eval(check_rewards(cfg), records)
    n = cfg.eval.samples_per_prompt
    temp = cfg.eval.temperature if cfg.eval.temperature is not None else cfg.rollout.temperature
    groups = dispatch.generate(rollout, records, n=n, temperature=temp, seed=EVAL_SEED)
    scores = dispatch.score(reward, groups, functions=plan.used)
    sampled, correct = summarise(plan, groups, scores)
    if progress and time.perf_counter() - t0 >= phase_line_after_s:
        acc = f"accuracy {sampled['accuracy']:.3f}" if "accuracy" in sampled else f"mean reward {sampled['mean_reward']:.3f}"
        progress(f"  {label}: {len(scores.total)} sampled completions in {time.perf_counter() - t0:.0f} s, {acc}"
                 + ("; greedy next" if cfg.eval.greedy else ""))
    note = plan.describe()
    if correct is not None and not plan.accuracy:  # multi-turn: the environment's reward decides
        note = (f"evaluation: accuracy and pass@k from the environment's reward (correct: env_reward >= {CORRECT_AT}); "
                f"no configured reward checks a reference answer")
    _say_once(note)
    report: dict[str, Any] = {
        "num_prompts": len(records),
        "samples_per_prompt": n,
        "temperature": temp,
        "rewards_used": plan.used,
        "rewards_skipped": {k: f"needs column(s) {', '.join(v)}" for k, v in plan.skipped.items()},
        "accuracy_rewards": plan.accuracy,
        "mean_reward": sampled["mean_reward"],
        "reward_means": sampled["reward_means"],
        "num_completions": len(scores.total),
    }
    if "reward_errors" in sampled:  # completions each reward function failed on
        report["reward_errors"] = sampled["reward_errors"]
    broken = whole_batch_failures(scores)  # a reward that failed on every completion (the run stops before training)
    if broken:
        report["reward_failures"] = broken
    if note:
        report["note"] = note
    report.update(tool_use(groups))
    if correct is not None:
        report["accuracy_from"] = plan.accuracy or ["env_reward"]
        report["sampled_accuracy"] = sampled["accuracy"]
        for k in cfg.eval.pass_k:
            report[f"pass@{k}"] = sum(pass_at_k(n, int(sum(row)), k) for row in correct) / len(correct)
    if cfg.eval.greedy:
        greedy = dispatch.generate(rollout, records, n=1, temperature=0.0, seed=EVAL_SEED)
        g, _ = summarise(plan, greedy, dispatch.score(reward, greedy, functions=plan.used))
        report["greedy_mean_reward"] = g["mean_reward"]
        if "accuracy" in g:
            report["greedy_accuracy"] = g["accuracy"]
    report["seconds"] = time.perf_counter() - t0
    if with_samples:
        report["samples"] = [
            {"prompt": grp.rollouts[0].prompt, "answer": str(grp.rollouts[0].columns.get("answer")),
             "completions": [r.completion for r in grp.rollouts],
             **({"conversations": [r.messages for r in grp.rollouts]} if grp.rollouts[0].messages is not None else {}),
             "correct": correct[j] if correct is not None else None}
            for j, grp in enumerate(groups[:with_samples])]
    return report


def evaluate_sets(cfg: Config, rollout: "ActorGroup", reward: "ActorGroup", records: list[Any],
                  extra: dict[str, list[Any]] | None = None, with_samples: int = 0,
                  progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """:func:`evaluate` on the main held-out set, then on each ``eval.extra`` set (``extra``: name ->
    records): the main report, with each extra set's report (and its ``source``) under
    ``report["extra"][name]``. ``progress`` gets a line per set, or, with one set, one where its
    sampled phase was long (PHASE_LINE_AFTER_S)."""
    report = evaluate(cfg, rollout, reward, records, with_samples=with_samples, progress=progress,
                      phase_line_after_s=0.0 if extra else PHASE_LINE_AFTER_S)
    if extra:
        report["extra"] = {}
        for name, recs in extra.items():
            rep = evaluate(cfg, rollout, reward, recs, with_samples=with_samples, progress=progress, label=name)
            rep["source"] = cfg.eval.extra.get(name)
            report["extra"][name] = rep
    return report


def eval_metrics(report: dict[str, Any], prefix: str = "eval") -> dict[str, float]:
    """The ``eval/…`` scalars of a report (``eval/reward/<name>`` per reward); each extra set's
    under ``eval/<set>/…``."""
    keys = ["sampled_accuracy", "greedy_accuracy", "mean_reward", "greedy_mean_reward", *TOOL_USE] + \
        [k for k in report if k.startswith("pass@")]
    out = {f"{prefix}/{k}": float(report[k]) for k in keys if k in report}
    out.update({f"{prefix}/reward/{k}": float(v) for k, v in report.get("reward_means", {}).items()})
    for name, rep in report.get("extra", {}).items():
        out.update(eval_metrics(rep, f"{prefix}/{name}"))
    return out


def headline(report: dict[str, Any]) -> str:
    """``sampled accuracy 0.123`` (or the mean reward where no reward checks an answer)."""
    if "sampled_accuracy" in report:
        return f"sampled accuracy {report['sampled_accuracy']:.3f}"
    return f"mean reward {report['mean_reward']:.3f}"
