"""What a math run's completions write as their answer, step by step: the reward hacks of a run.

    python benchmarks/answer_forms.py runs/a [runs/b ...]

Reads the W&B sample tables a ``grpo-dist train`` run logs (``logging.sample_table_every``; the
offline run under ``<run>/wandb/``) and sorts every completion by the form of its final answer:

The forms are those of ``grpo_dist/reward/answer_form.py`` (a run logs their shares each step as
``rollout/answer_form/<form>`` where a ``math`` reward is configured).

Prints a markdown table: per run and logged step, the share of each form, of completions cut at
``max_tokens``, and the mean reward.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import sys
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from grpo_dist.reward.answer_form import FORMS, answer_form  # noqa: E402  (what a run logs each step)


def tables(run: str) -> list[tuple[int, dict[str, Any]]]:
    """``(step, table)`` for each sample table of ``run`` (one W&B run directory, links skipped)."""
    out = {}
    for path in glob.glob(os.path.join(run, "wandb", "*", "files", "media", "table", "samples_*.table.json")):
        if os.path.islink(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(path))))):
            continue  # wandb/latest-run
        step = int(re.search(r"samples_(\d+)_", os.path.basename(path)).group(1))
        with open(path) as f:
            out[step] = json.load(f)
    return sorted(out.items())


def rows(run: str) -> list[dict[str, Any]]:
    out = []
    for step, t in tables(run):
        cols = t["columns"]
        ci, ri = cols.index("completion"), cols.index("reward")
        fi = cols.index("finish_reason") if "finish_reason" in cols else None
        data = t["data"]
        n = len(data) or 1
        counts = {f: 0 for f in FORMS}
        for r in data:
            counts[answer_form(str(r[ci]))] += 1
        out.append({"run": run, "step": step, "n": len(data), **{f: c / n for f, c in counts.items()},
                    "truncated": sum(1 for r in data if fi is not None and r[fi] == "length") / n,
                    "reward": sum(float(r[ri]) for r in data) / n})
    return out


def table(all_rows: list[dict[str, Any]]) -> str:
    head = "| run | step | n | " + " | ".join(FORMS) + " | cut at max_tokens | mean reward |"
    lines = [head, "|" + "---|" * (len(FORMS) + 5)]
    for r in all_rows:
        lines.append(f"| {r['run']} | {r['step']} | {r['n']} | " + " | ".join(f"{r[f]:.2f}" for f in FORMS)
                     + f" | {r['truncated']:.2f} | {r['reward']:.3f} |")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("runs", nargs="+", help="grpo-dist train output directories")
    args = p.parse_args()
    found = [r for run in args.runs for r in rows(run)]
    if not found:
        raise SystemExit("answer_forms: no sample tables under <run>/wandb/*/files/media/table/ "
                         "(logging.sample_table_every, W&B offline or online)")
    print(table(found))


if __name__ == "__main__":
    main()
