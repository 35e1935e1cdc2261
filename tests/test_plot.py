"""`grpo-dist plot RUN_DIR`: a run's curves as one PNG from its metrics.jsonl and summary.json."""

from __future__ import annotations

import json
import struct
import subprocess
import sys
from pathlib import Path

from grpo_dist.run.outputs import read_metrics, write_metrics

ROOT = Path(__file__).resolve().parents[1]


def _run_dir(tmp_path: Path, steps: int = 6) -> Path:
    history = [{"step": float(s), "rollout/reward_mean": 0.1 * s, "reward/math": 0.08 * s, "reward/pattern": 0.2,
                "rollout/completion_length_mean": 100.0 - 5 * s, "rollout/truncated_frac": 0.5 - 0.05 * s,
                "timing/generate": 14.0, "timing/score": 0.4, "timing/learn": 25.0, "timing/sync": 0.5}
               for s in range(1, steps + 1)]
    write_metrics(tmp_path, history[:2], append=False)
    write_metrics(tmp_path, history[2:])
    (tmp_path / "summary.json").write_text(json.dumps({"sampled_accuracy_before": 0.05,
                                                       "sampled_accuracy_after": 0.2}))
    return tmp_path


def _png_size(path: Path) -> tuple[int, int]:
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n", head
    return struct.unpack(">II", head[16:24])


def test_metrics_file_round_trips(tmp_path):
    run = _run_dir(tmp_path)
    assert [h["step"] for h in read_metrics(run)] == [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
    write_metrics(run, read_metrics(run)[:3], append=False)  # a resume rewrites the restored steps
    assert len(read_metrics(run)) == 3


def test_plot_cli_writes_a_png_and_refuses_a_directory_without_metrics(tmp_path):
    (tmp_path / "run").mkdir()
    run = _run_dir(tmp_path / "run")
    out = tmp_path / "curves.png"
    cli = [sys.executable, "-m", "grpo_dist.cli", "plot"]
    r = subprocess.run([*cli, str(run), "--out", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert f"wrote {out}" in r.stdout
    w, h = _png_size(out)
    assert w >= 1000 and h >= 300
    empty = tmp_path / "empty"
    empty.mkdir()
    r = subprocess.run([*cli, str(empty)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and r.stderr.strip() == (f"error: {empty} has no metrics.jsonl: not a run directory "
                                                      "of grpo-dist train, or no step finished yet"), r.stderr
