"""Exact resume: the driver is killed with SIGKILL mid-run, `--checkpoint.resume auto` continues,
and the steps after the checkpoint equal those of an uninterrupted run.

Through the CLI, as a user runs it (local Ray, DeepSpeed learner, transformers rollout backend for
speed, W&B offline), with LoRA dropout 0.1. Sampling seeds are a function of (seed, step, prompt,
sample), the learner's optimizer, scheduler and torch RNG (the dropout masks) come back from the
checkpoint and the prompt stream from its saved position, so the metrics agree exactly except for
clocks.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[1]
STEPS = 8  # six steps after the kill point: the run cannot end between two polls
CLOCKS = ("timing/", "perf/", "sync/seconds")


def args(model_dir, out) -> list[str]:
    return [sys.executable, "-m", "grpo_dist.cli", "train", "--config", str(ROOT / "configs/tiny_cpu.yaml"),
            "--model.path", str(model_dir), "--model.make_if_missing", "null", "--output_dir", str(out),
            "--trainer.steps", str(STEPS), "--trainer.eval_before_after", "false", "--logging.progress", "false",
            "--rollout.backend", "hf", "--rollout.num_workers", "1", "--rollout.prompts_per_step", "4",
            "--rollout.group_size", "4", "--learner.micro_batch_size", "16", "--lora.dropout", "0.1",
            "--checkpoint.every", "1", "--checkpoint.keep", str(STEPS), "--logging.sample_table_every", "0"]


def history(out: Path) -> list[dict]:
    last = sorted((out / "checkpoints").glob("step_*"))[-1]
    return json.loads((last / "trainer_state.json").read_text())["run"]["history"]


def same(a: dict, b: dict) -> list[str]:
    keys = {k for k in a.keys() | b.keys() if not k.startswith(CLOCKS)}
    return sorted(k for k in keys if a.get(k) != pytest.approx(b.get(k), rel=1e-6, abs=1e-9))


@pytest.mark.timeout(900)
def test_sigkilled_driver_resumes_exactly(pretrained_model_dir, tmp_path):
    # as from a user's shell: not attached to a W&B service that this pytest process may have
    # started (WANDB_SERVICE is inherited; the killed driver's run would stay "in use" there)
    env = {k: v for k, v in os.environ.items() if k != "WANDB_SERVICE"}
    env["WANDB_MODE"] = "offline"
    whole = tmp_path / "whole"
    subprocess.run(args(pretrained_model_dir, whole), env=env, check=True, capture_output=True, timeout=600)

    out = tmp_path / "killed"
    drv = subprocess.Popen(args(pretrained_model_dir, out), env=env, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.time() + 600
        # every checkpoint is kept, so step 2's stays visible until the kill; polled often, as steps
        # take well under a second (session 7: keep 2 and a 0.2 s poll let the run outpace the test)
        while not (out / "checkpoints" / "step_000002" / "trainer_state.json").is_file():
            assert drv.poll() is None and time.time() < deadline, "the run ended before step 2"
            time.sleep(0.01)
        drv.send_signal(signal.SIGKILL)  # the driver only, as `kill -9 <pid>` would
        drv.wait()
    finally:
        if drv.poll() is None:
            drv.kill()
    done = sorted(int(p.name.split("_")[1]) for p in (out / "checkpoints").glob("step_*")
                  if (p / "trainer_state.json").is_file())
    k = done[-1]
    assert 2 <= k < STEPS, done
    run_id = json.loads((out / "run.json").read_text())["run_id"]

    resumed = subprocess.run([sys.executable, "-m", "grpo_dist.cli", "train", "--config", str(out / "config.yaml"),
                              "--checkpoint.resume", "auto"], env=env, capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"resumed from step {k} ({out / 'checkpoints' / f'step_{k:06d}'})" in resumed.stdout

    want, got = history(whole), history(out)
    assert [h["step"] for h in got] == [float(s) for s in range(1, STEPS + 1)]
    for a, b in zip(want, got):
        assert not same(a, b), f"step {a['step']}: {same(a, b)}"
    assert len({h["rollout/reward_mean"] for h in want}) > 1, "the metrics move between steps"
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps"] == STEPS and len(summary["reward_curve"]) == STEPS
    assert summary["reward_curve"] == [h["rollout/reward_mean"] for h in want]
    # one W&B run: the resumed process continued the killed one's run id
    runs = sorted(p.name for p in (out / "wandb").glob("offline-run-*"))
    assert len(runs) == 2 and all(r.endswith(run_id) for r in runs), runs
