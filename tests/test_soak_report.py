"""benchmarks/soak_report.py: the chaos soak's groups lost (a missing step, a short step, a line a full
disk cut short) and its table (``make soak`` itself runs for 20 minutes: not a test)."""

from __future__ import annotations

import json
import os

from scripts import load_script

SCRIPT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks", "soak_report.py")


def _metrics(path, rows, tail=""):
    path.mkdir(parents=True, exist_ok=True)
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows) + tail)


def test_groups_lost_counts_missing_and_short_steps_and_skips_a_cut_line(tmp_path):
    rep = load_script(SCRIPT)
    full = {"rollout/num_completions": 128.0}
    _metrics(tmp_path, [{"step": 1, **full}, {"step": 2, **full}, {"step": 3, **full}], tail='{"step": 4, "rol')
    steps = rep.read_steps(tmp_path)
    assert [s["step"] for s in steps] == [1, 2, 3]  # the line cut short by a full disk is skipped
    assert rep.groups_lost(steps, 16, 8) == 0
    gap = [{"step": 1, **full}, {"step": 3, "rollout/num_completions": 120.0}]
    assert rep.groups_lost(gap, 16, 8) == 16 + 1  # step 2 missing, one group short at step 3
    assert rep.read_steps(tmp_path / "none") == []
    assert rep.resumed_from("x\nresumed from step 45 (/r/checkpoints/step_000045)\n") == 45
    assert rep.resumed_from("no checkpoint in /r, starting fresh") is None


def test_table_counts_detections_pauses_and_replayed_steps():
    rep = load_script(SCRIPT)
    faults = [{"kind": "kill_engine", "t": 60, "step": 10, "target": "ray::RolloutActor", "detected": True,
               "expected": True, "detect_s": 2.0, "back_s": 75.5, "outcome": "rollout worker 0 died | restart 1"},
              {"kind": "pause_reward", "t": 90, "step": 20, "detected": False, "expected": False, "outcome": "ok"},
              {"kind": "stop_engine", "t": 120, "step": 30, "detected": False, "expected": True, "outcome": "x"},
              {"kind": "sigint", "t": 200, "step": 40, "detected": True, "expected": True, "detect_s": 6.0}]
    report = {"soak": {"faults": faults, "not_injected": ["disk_full"], "steps": 50, "minutes": 5.0, "segments": 2,
                       "stops": [{"step": 42, "resumed_from": 40}], "groups_lost": 0,
                       "accuracy": {"sampled_accuracy_after": 0.5}},
              "unfaulted": {"steps": 50, "minutes": 3.0, "groups_lost": 0, "accuracy": {"sampled_accuracy_after": 0.25}}}
    text = "\n".join(rep.markdown(report))
    assert "| 1 | 60 | 10 | kill_engine | `ray::RolloutActor` | yes | 2 | 75.5 | rollout worker 0 died / restart 1 |" in text
    assert "| not needed |" in text and "| 3 | 120 | 30 | stop_engine | `` | no | - | - |" in text
    assert "faults injected: 4 (3 to detect, 1 pauses" in text and "detected: 2 of 3" in text
    assert "not injected (out of time): disk_full" in text
    assert "median 4.0 s, max 6.0 s" in text and "2 steps replayed" in text and "groups lost: 0" in text
    assert "after the soak 0.500" in text and "50 steps: 0.250" in text
