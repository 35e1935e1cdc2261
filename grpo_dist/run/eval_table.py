"""The table ``grpo-dist eval`` prints: one row per metric, base / adapter / delta columns, one table
per held-out set (the main one, then each of ``eval.extra``); the JSON report, with sample
completions, goes to a file."""

from __future__ import annotations

from typing import Any

_ROWS = [("sampled_accuracy", "sampled_acc"), ("greedy_accuracy", "greedy_acc")]
# multi-turn environments (run/evaluation.py tool_use)
_TOOL_ROWS = [("turns_mean", "turns/traj"), ("tool_calls_mean", "tool_calls/traj"), ("tool_use_frac", "tool_use_frac"),
              ("tool_call_ok_frac", "tool_call_ok"), ("tool_errors_mean", "tool_errors/traj")]


def _rows(rep: dict[str, Any]) -> list[tuple[str, str]]:
    """(report key, label) of every scalar the report has, in the table's order."""
    rows = [(k, label) for k, label in _ROWS if k in rep]
    rows += sorted(((k, k) for k in rep if k.startswith("pass@")), key=lambda kv: int(kv[0][5:]))
    rows += [("mean_reward", "mean_reward")]
    if "greedy_mean_reward" in rep:
        rows.append(("greedy_mean_reward", "greedy_reward"))
    rows += [(k, label) for k, label in _TOOL_ROWS if k in rep]
    means = rep.get("reward_means", {})
    if len(means) > 1:  # one function: its mean is mean_reward
        rows += [(f"reward_means/{k}", f"reward/{k}") for k in sorted(means)]
    return rows


def _get(rep: dict[str, Any], key: str) -> float | None:
    if key.startswith("reward_means/"):
        return rep.get("reward_means", {}).get(key.split("/", 1)[1])
    v = rep.get(key)
    return float(v) if isinstance(v, (int, float)) else None


def _table(base: dict[str, Any], adapter: dict[str, Any] | None, what: str) -> list[str]:
    label_w = max([len(label) for _, label in _rows(base)] + [11]) + 2
    head = f"{'':{label_w}s}{'base':>8s}" + (f"{'adapter':>10s}{'delta':>9s}" if adapter else "")
    where = f"({base['num_prompts']} {what}, {base['samples_per_prompt']} samples each, T={float(base['temperature'])})"
    lines = [f"{head}      {where}"]
    for key, label in _rows(base):
        b = _get(base, key)
        if b is None:
            continue
        line = f"{label:{label_w}s}{b:8.3f}"
        if adapter is not None:
            a = _get(adapter, key)
            line += f"{a:10.3f}{a - b:+9.3f}" if a is not None else f"{'-':>10s}"
        lines.append(line)
    return lines


def eval_table(report: dict[str, Any]) -> list[str]:
    """The lines: a header naming the held-out set, the table; the same for each ``eval.extra`` set;
    then where the report is."""
    base = report["base"]
    adapter = report.get("adapter_eval")
    lines = _table(base, adapter, "held-out prompts")
    for name, rep in base.get("extra", {}).items():
        other = (adapter or {}).get("extra", {}).get(name)
        lines += ["", f"{name}: {rep.get('source')}"] + _table(rep, other, f"prompts of {name}")
    # base["note"] (what decided accuracy) is logged once while evaluating, above the table
    lines.append(f"report: {report['report_path']} (with {len(base.get('samples', []))} prompts and their "
                 f"completions per model and set)")
    if report.get("wandb_dir"):
        lines.append(f"wandb:  {report['wandb_dir']}")
    return lines
