"""tests/budget_plugin.py: a test past its budget fails the session (one worker and two), the ten slowest are
printed beside their budgets, and GRPO_DIST_TEST_BUDGET_SCALE=0 turns the check off."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent

INNER = '''
import time, pytest
@pytest.fixture(scope="session")
def built_once():
    time.sleep(0.6)
def test_quick(built_once):
    pass
@pytest.mark.slow
def test_slow_default():
    pass
@pytest.mark.budget(0.3)
def test_over():
    time.sleep(0.6)
'''


def _run(tmp_path: Path, *args: str, scale: str | None = None) -> subprocess.CompletedProcess:
    (tmp_path / "test_inner.py").write_text(INNER)
    env = {**os.environ, "PYTHONPATH": str(HERE)}
    env.pop("GRPO_DIST_TEST_BUDGET_SCALE", None)
    if scale is not None:
        env["GRPO_DIST_TEST_BUDGET_SCALE"] = scale
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "budget_plugin", "-q", "-p", "no:cacheprovider",
                           "-m", "slow or not slow", *args, "test_inner.py"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)


@pytest.mark.budget(40)  # an inner pytest (two with xdist) started under load
@pytest.mark.parametrize("workers", [[], ["-n", "2"]], ids=["one-process", "xdist"])
def test_a_test_past_its_budget_fails_the_session(tmp_path, workers):
    p = _run(tmp_path, *workers)
    out = p.stdout
    assert p.returncode == 1, out + p.stderr
    assert "3 passed" in out
    assert "OVER BUDGET: test_inner.py::test_over took 0." in out and "its budget is 0.3 s" in out
    table = out.split("slowest tests and their budgets", 1)[1]
    lines = [ln for ln in table.splitlines() if "test_inner.py::" in ln and "OVER" not in ln]
    assert lines[0].split()[-1] == "test_inner.py::test_over"  # slowest first
    budgets = {ln.split()[-1].split("::")[1]: float(ln.split()[3]) for ln in lines}
    assert budgets == {"test_over": 0.3, "test_quick": 60.0, "test_slow_default": 240.0}
    # a session fixture's set-up (the cache's models) is not charged: 0.6 s of it leaves test_quick near 0
    quick = [ln for ln in lines if ln.endswith("::test_quick")][0]
    assert float(quick.split()[0]) < 0.3, quick


@pytest.mark.budget(40)
def test_a_zero_scale_turns_off_the_check(tmp_path):
    p = _run(tmp_path, scale="0")
    assert p.returncode == 0 and "slowest tests" in p.stdout and "OVER BUDGET" not in p.stdout
