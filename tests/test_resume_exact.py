"""Exact resume: the driver is killed with SIGKILL mid-run (or stopped with SIGINT, which saves
first), `--checkpoint.resume auto` continues, and the steps after the checkpoint equal those of one
uninterrupted run (shared by both tests).

Through the CLI, as a user runs it (local Ray, DeepSpeed learner, transformers rollout backend for
speed, W&B offline), with LoRA dropout 0.1. Sampling seeds are a function of (seed, step, prompt,
sample), the learner's optimizer, scheduler and torch RNG (the dropout masks) come back from the
checkpoint and the prompt stream from its saved position, so the metrics agree exactly except for
clocks.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from grpo_dist.run.outputs import read_metrics

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


def user_env() -> dict[str, str]:
    """As from a user's shell: not attached to a W&B service that this pytest process may have
    started (WANDB_SERVICE is inherited; a killed driver's run would stay "in use" there)."""
    env = {k: v for k, v in os.environ.items() if k != "WANDB_SERVICE"}
    env["WANDB_MODE"] = "offline"
    return env


@pytest.fixture(scope="module")
def whole(pretrained_model_dir, tmp_path_factory) -> Path:
    """The uninterrupted run both tests compare with (one run for the module)."""
    out = tmp_path_factory.mktemp("whole") / "run"
    subprocess.run(args(pretrained_model_dir, out), env=user_env(), check=True, capture_output=True, timeout=600)
    return out


def start_until_step2(model_dir, out: Path, **popen) -> subprocess.Popen:
    """The driver started in a session of its own, returned once step 2's checkpoint is complete.
    Every checkpoint is kept, so step 2's stays visible; polled often, as steps take well under a
    second (session 7: keep 2 and a 0.2 s poll let the run outpace the test)."""
    drv = subprocess.Popen(args(model_dir, out), env=user_env(), start_new_session=True, **popen)
    deadline = time.time() + 600
    while not (out / "checkpoints" / "step_000002" / "trainer_state.json").is_file():
        if drv.poll() is not None or time.time() >= deadline:
            drv.kill()
            raise AssertionError("the run ended (or stalled) before step 2")
        time.sleep(0.01)
    return drv


def resume(out: Path, says: str, *more: str) -> subprocess.CompletedProcess:
    """``--checkpoint.resume auto`` on the run in ``out`` as a user types it (``more``: options
    after it); it succeeds and prints ``says``."""
    resumed = subprocess.run([sys.executable, "-m", "grpo_dist.cli", "train", "--config", str(out / "config.yaml"),
                              "--checkpoint.resume", "auto", *more], env=user_env(), capture_output=True, text=True,
                             timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert says in resumed.stdout
    return resumed


def matching_histories(whole: Path, out: Path) -> tuple[list[dict], list[dict]]:
    """The uninterrupted run's history and the resumed one's: every step once, each step's metrics equal."""
    want, got = history(whole), history(out)
    assert [h["step"] for h in got] == [float(s) for s in range(1, STEPS + 1)]
    for a, b in zip(want, got):
        assert not same(a, b), f"step {a['step']}: {same(a, b)}"
    return want, got


def test_sigkilled_driver_resumes_exactly(pretrained_model_dir, whole, tmp_path):
    out = tmp_path / "killed"
    drv = start_until_step2(pretrained_model_dir, out, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
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

    resume(out, f"resumed from step {k} ({out / 'checkpoints' / f'step_{k:06d}'})")
    want, got = matching_histories(whole, out)
    assert len({h["rollout/reward_mean"] for h in want}) > 1, "the metrics move between steps"
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps"] == STEPS and len(summary["reward_curve"]) == STEPS
    assert summary["reward_curve"] == [h["rollout/reward_mean"] for h in want]
    # metrics.jsonl: every step once, the killed segment's steps after its checkpoint replaced
    assert read_metrics(out) == got
    # one W&B run: the resumed process continued the killed one's run id
    runs = sorted(p.name for p in (out / "wandb").glob("offline-run-*"))
    assert len(runs) == 2 and all(r.endswith(run_id) for r in runs), runs


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False


@pytest.mark.timeout(900)
def test_sigint_finishes_the_step_saves_and_resumes_exactly(pretrained_model_dir, whole, tmp_path):
    """Ctrl-C / SIGTERM, as a user stops a run: the first signal lets the current step finish,
    saves a checkpoint, prints one line naming the step and the resume command, exits 130 with no
    traceback and no process of the run left; the resumed run equals the uninterrupted one."""
    out = tmp_path / "stopped"
    drv = start_until_step2(pretrained_model_dir, out, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
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

    resume(out, f"resumed from step {k}")
    matching_histories(whole, out)
    assert json.loads((out / "summary.json").read_text())["steps"] == STEPS


@pytest.mark.timeout(900)
def test_a_damaged_newest_checkpoint_is_skipped_and_the_one_before_resumed(whole, tmp_path):
    """Issue 52: the newest checkpoint as a power cut left it before checkpoints were fsynced (its
    trainer_state.json cut to zero bytes), or with a file of its learner state lost since. Two
    copies of the uninterrupted run, each damaged one way: naming that checkpoint is one line
    (exit 2, before anything starts); ``resume auto`` names it, skips it, resumes from the step
    before and ends as the uninterrupted run. The failure watches' counts went into every
    checkpoint and came back (issue 52 item 3: ``env_watch``, next to ``reward_watch``)."""
    last = f"step_{STEPS:06d}"
    assert json.loads((whole / "checkpoints" / last / "trainer_state.json").read_text())["run"]["env_watch"][
        "steps"] == STEPS

    def cut_state(d: Path) -> str:
        size = (d / "trainer_state.json").stat().st_size
        (d / "trainer_state.json").write_bytes(b"")
        return f"trainer_state.json has 0 bytes, its manifest says {size}"

    def remove_learner_file(d: Path) -> str:
        f = sorted(d.glob("global_step*/*model_states.pt"))[0]
        f.unlink()
        return f"{f.relative_to(d).as_posix()} is missing"

    for damage in (cut_state, remove_learner_file):
        out = tmp_path / damage.__name__
        shutil.copytree(whole, out, symlinks=True)
        newest, before = out / "checkpoints" / last, out / "checkpoints" / f"step_{STEPS - 1:06d}"
        why = damage(newest)
        named = subprocess.run([sys.executable, "-m", "grpo_dist.cli", "train", "--config", str(out / "config.yaml"),
                                "--output_dir", str(out), "--checkpoint.resume", str(newest)], env=user_env(),
                               capture_output=True, text=True, timeout=300)
        assert named.returncode == 2 and "Traceback" not in named.stderr, named.stderr[-3000:]
        assert named.stderr.strip().splitlines() == [
            f"config error: checkpoint.resume: {newest} is not a complete checkpoint ({why}); name another, or "
            f"resume with auto (the newest complete one)"]

        resumed = resume(out, f"resumed from step {STEPS - 1} ({before})", "--output_dir", str(out))
        skipped = f"warning: checkpoint.resume auto: skipping {newest}: not a complete checkpoint ({why})"
        assert resumed.stderr.splitlines().count(skipped) == 1, resumed.stderr[-3000:]
        matching_histories(whole, out)
        state = json.loads((newest / "trainer_state.json").read_text())  # written anew, whole
        assert state["run"]["env_watch"]["steps"] == STEPS, "the env error counts restored, then counted on"
        assert state["run"]["reward_watch"]["steps"] == STEPS
