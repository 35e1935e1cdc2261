"""Ctrl-C / SIGTERM through the CLI, as a user stops a run: the first signal lets the current step
finish, saves a checkpoint, prints one line naming the step and the resume command, exits 130 with
no traceback and no process of the run left; the resumed run equals an uninterrupted one.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from test_resume_exact import STEPS, args, history, same

pytestmark = pytest.mark.slow


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False


@pytest.mark.timeout(900)
def test_sigint_finishes_the_step_saves_and_resumes_exactly(pretrained_model_dir, tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "WANDB_SERVICE"}
    env["WANDB_MODE"] = "offline"
    whole = tmp_path / "whole"
    subprocess.run(args(pretrained_model_dir, whole), env=env, check=True, capture_output=True, timeout=600)

    out = tmp_path / "stopped"
    drv = subprocess.Popen(args(pretrained_model_dir, out), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True, start_new_session=True)
    try:
        deadline = time.time() + 600
        while not (out / "checkpoints" / "step_000002" / "trainer_state.json").is_file():
            assert drv.poll() is None and time.time() < deadline, "the run ended before step 2"
            time.sleep(0.01)
        t0 = time.time()
        drv.send_signal(signal.SIGINT)  # the driver, as Ctrl-C in its terminal
        _, err = drv.communicate(timeout=300)
        stop_s = time.time() - t0
    finally:
        if drv.poll() is None:
            drv.kill()
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert drv.returncode == 130, err[-3000:]
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err[-3000:]
    k = max(int(p.name.split("_")[1]) for p in (out / "checkpoints").glob("step_*")
            if (p / "trainer_state.json").is_file())
    assert 2 <= k < STEPS
    command = f"grpo-dist train --config {out / 'config.yaml'} --checkpoint.resume auto"
    # the driver's last words (lines the actors logged may be forwarded after them)
    said = f"interrupted (SIGINT) at step {k} (checkpoint {out / 'checkpoints' / f'step_{k:06d}'}); resume with: {command}"
    assert said in lines, lines[-5:]
    assert any(ln.startswith("SIGINT: stopping after step") for ln in lines)
    print(f"SIGINT -> exit 130 in {stop_s:.1f} s at step {k}")
    deadline = time.time() + 60  # the run's processes (Ray's included) are gone
    while _group_alive(drv.pid) and time.time() < deadline:
        time.sleep(0.5)
    assert not _group_alive(drv.pid), "a process of the interrupted run is still alive"

    resumed = subprocess.run([sys.executable, "-m", "grpo_dist.cli", "train", "--config", str(out / "config.yaml"),
                              "--checkpoint.resume", "auto"], env=env, capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"resumed from step {k}" in resumed.stdout
    want, got = history(whole), history(out)
    assert [h["step"] for h in got] == [float(s) for s in range(1, STEPS + 1)]
    for a, b in zip(want, got):
        assert not same(a, b), f"step {a['step']}: {same(a, b)}"
    assert json.loads((out / "summary.json").read_text())["steps"] == STEPS
