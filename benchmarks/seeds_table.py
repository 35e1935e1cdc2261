"""Runs of one recipe grouped by setting (dtype, seed): held-out accuracy per run, each setting's mean
and spread, and every run's reward curve in one picture.

    python benchmarks/seeds_table.py "fp32=runs/a,runs/b" "bf16=runs/c,runs/d" [--plot out.png]

Each run directory is a finished ``grpo-dist train`` output (its ``summary.json``). Prints a markdown
table: per run, then per setting (mean, and min-max over its seeds).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from typing import Any, Optional

COLUMNS = [("sampled", "sampled_accuracy_after"), ("greedy", "greedy_accuracy_after")]


def load(run: str) -> dict[str, Any]:
    with open(os.path.join(run, "summary.json")) as f:
        s = json.load(f)
    t = s.get("mean_timing", {})
    row = {"run": run, "wall_s": s.get("wall_seconds"), "s_per_step": t.get("timing/step"),
           "curve": s.get("reward_curve") or []}
    row.update({c: s.get(k) for c, k in COLUMNS})
    for name, one in (s.get("eval_sets") or {}).items():  # eval.extra: the other held-out sets
        row[f"{name}_sampled"] = one.get("sampled_accuracy_after")
        row[f"{name}_greedy"] = one.get("greedy_accuracy_after")
    return row


def parse_groups(specs: list[str]) -> dict[str, list[str]]:
    groups: dict[str, list[str]] = {}
    for spec in specs:
        label, sep, runs = spec.partition("=")
        if not sep or not runs:
            raise SystemExit(f"seeds_table: {spec!r}: expected LABEL=RUN[,RUN...]")
        groups.setdefault(label, []).extend(r for r in runs.split(",") if r)
    return groups


def _fmt(v: Optional[float], digits: int = 3) -> str:
    return "-" if v is None else f"{v:.{digits}f}"


def table(groups: dict[str, list[dict[str, Any]]]) -> str:
    sets = sorted({k[: -len("_sampled")] for rows in groups.values() for r in rows for k in r if k.endswith("_sampled")})
    cols = [c for c, _ in COLUMNS] + [f"{n}_{c}" for n in sets for c, _ in COLUMNS]
    lines = ["| setting | run | " + " | ".join(cols) + " | s/step | wall s |",
             "|---|---|" + "---|" * (len(cols) + 2)]
    for label, rows in groups.items():
        for r in rows:
            lines.append(f"| {label} | {r['run']} | " + " | ".join(_fmt(r.get(c)) for c in cols)
                         + f" | {_fmt(r['s_per_step'], 1)} | {_fmt(r['wall_s'], 0)} |")
    lines += ["", "| setting | seeds | " + " | ".join(f"{c} mean (min-max)" for c in cols) + " |",
              "|---|---|" + "---|" * len(cols)]
    for label, rows in groups.items():
        cells = []
        for c in cols:
            vals = [r[c] for r in rows if r.get(c) is not None]
            cells.append(f"{statistics.fmean(vals):.3f} ({min(vals):.3f}-{max(vals):.3f})" if vals else "-")
        lines.append(f"| {label} | {len(rows)} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(groups: dict[str, list[dict[str, Any]]], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, (label, rows) in enumerate(groups.items()):
        for j, r in enumerate(rows):
            ax.plot(range(1, len(r["curve"]) + 1), r["curve"], color=colours[i % len(colours)], alpha=0.8,
                    label=label if j == 0 else None)
    ax.set_xlabel("step")
    ax.set_ylabel("training reward (mean)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("groups", nargs="+", help="LABEL=RUN[,RUN...]")
    ap.add_argument("--plot", help="every run's reward curve, coloured by setting, into this PNG")
    a = ap.parse_args(argv)
    groups = {label: [load(r) for r in runs] for label, runs in parse_groups(a.groups).items()}
    print(table(groups))
    if a.plot:
        plot(groups, a.plot)
        print(f"reward curves: {a.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
