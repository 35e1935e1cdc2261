"""The chaos soak's figures (benchmarks/soak.py): a run's steps from ``metrics.jsonl``, the groups it
lost, and the markdown table of docs/errors.md."""

from __future__ import annotations

import json
import re
import statistics
from pathlib import Path


def read_steps(run_dir: Path) -> list[dict]:
    """The run's logged steps (a line cut short by a full disk is skipped)."""
    path = Path(run_dir) / "metrics.jsonl"
    if not path.exists():
        return []
    steps = []
    for line in path.read_text(errors="replace").splitlines():
        try:
            steps.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return steps


def groups_lost(steps: list[dict], prompts: int, group_size: int = 8) -> int:
    """Groups a step should have trained on and did not: a missing step counts all ``prompts``."""
    got = {int(m["step"]): m for m in steps}
    last = max(got, default=0)
    lost = 0
    for s in range(1, last + 1):
        n = got[s].get("rollout/num_completions", 0) / group_size if s in got else 0
        lost += prompts - int(n)
    return lost


def resumed_from(stdout: str) -> int | None:
    m = re.search(r"resumed from step (\d+)", stdout)
    return int(m.group(1)) if m else None


def _num(v) -> str:
    return "-" if v is None else f"{v:g}"


def _acc(a: dict, key: str) -> str:
    v = (a or {}).get(key)
    return "-" if v is None else f"{v:.3f}"


def markdown(report: dict) -> list[str]:
    soak, base = report["soak"], report.get("unfaulted", {})
    rows = ["| # | at (s) | step | fault | target | detected | detection (s) | training again (s) | what the run did |",
            "|---|---|---|---|---|---|---|---|---|"]
    for i, f in enumerate(soak["faults"], 1):
        expected = f.get("expected", True)
        seen = ("yes" if f.get("detected") else "no") if expected else (
            "replaced (false alarm)" if f.get("detected") else "not needed")
        what = str(f.get("outcome", "")).replace("|", "/")
        rows.append(f"| {i} | {f['t']} | {f['step']} | {f['kind']} | `{f.get('target', '')}` | {seen} | "
                    f"{_num(f.get('detect_s'))} | {_num(f.get('back_s'))} | {what} |")
    want = [f for f in soak["faults"] if f.get("expected", True)]
    found = [f for f in want if f.get("detected")]
    times = [f["detect_s"] for f in found if f.get("detect_s") is not None]
    replayed = sum(max(0, s["step"] - s["resumed_from"]) for s in soak["stops"] if s.get("resumed_from") is not None)
    a, b = soak.get("accuracy", {}), base.get("accuracy", {})
    load = soak.get("load_avg") or []
    rows += ["", f"- machine: {soak.get('cpu', '?')}; load average (1/5/15 min) "
             + " -> ".join("/".join(f"{x:.1f}" for x in la) for la in load) + " (start -> end)",
             f"- faults injected: {len(soak['faults'])} ({len(want)} to detect, "
             f"{len(soak['faults']) - len(want)} pauses shorter than the heartbeat limit); detected: "
             f"{len(found)} of {len(want)}" + (f"; not injected (out of time): {', '.join(soak['not_injected'])}"
                                                if soak.get("not_injected") else ""),
             f"- detection: median {statistics.median(times):.1f} s, max {max(times):.1f} s" if times else
             "- detection: none timed",
             f"- {soak['steps']} steps in {soak['minutes']} min over {soak['segments']} segments (run "
             f"resumed {len(soak['stops'])} times; {replayed} steps replayed from checkpoints); groups lost: "
             f"{soak['groups_lost']}",
             f"- held-out sampled accuracy: before {_acc(a, 'sampled_accuracy_before')}, after the soak "
             f"{_acc(a, 'sampled_accuracy_after')} (greedy {_acc(a, 'greedy_accuracy_after')}); the unfaulted run "
             f"of the same seed, {base.get('steps', '-')} steps: {_acc(b, 'sampled_accuracy_after')} (greedy "
             f"{_acc(b, 'greedy_accuracy_after')}, {base.get('minutes', '-')} min, groups lost "
             f"{base.get('groups_lost', '-')})"]
    return rows
