"""benchmarks/seeds_table.py: runs grouped by setting, each setting's mean and spread over its seeds."""

from __future__ import annotations

import json
import os

import pytest
from scripts import load_script

SCRIPT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks", "seeds_table.py")


def _run(path, sampled, greedy, curve):
    path.mkdir(parents=True)
    (path / "summary.json").write_text(json.dumps({
        "steps": len(curve), "wall_seconds": 100.0, "mean_timing": {"timing/step": 4.0}, "reward_curve": curve,
        "sampled_accuracy_before": 0.1, "sampled_accuracy_after": sampled, "greedy_accuracy_after": greedy,
        "eval_sets": {"ood": {"sampled_accuracy_after": sampled / 2, "greedy_accuracy_after": None}}}))
    return str(path)


def test_each_setting_gets_its_mean_and_range_and_every_curve_is_drawn(tmp_path):
    mod = load_script(SCRIPT)
    a, b = _run(tmp_path / "a", 0.9, 0.8, [0.1, 0.5]), _run(tmp_path / "b", 0.5, 0.6, [0.1, 0.2])
    c = _run(tmp_path / "c", 0.7, 0.7, [0.2, 0.6])
    groups = {label: [mod.load(r) for r in runs] for label, runs in mod.parse_groups([f"x={a},{b}", f"y={c}"]).items()}
    out = mod.table(groups)
    assert "| x | 2 | 0.700 (0.500-0.900) | 0.700 (0.600-0.800) | 0.350 (0.250-0.450) | - |" in out, out
    assert "| y | 1 | 0.700 (0.700-0.700) |" in out
    mod.plot(groups, str(tmp_path / "curves.png"))
    assert (tmp_path / "curves.png").stat().st_size > 1000
    with pytest.raises(SystemExit, match="expected LABEL=RUN"):
        mod.parse_groups(["no-label"])
