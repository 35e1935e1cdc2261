"""Hung and killed engines, a hung learner, Ctrl-C during a hang: through ``grpo-dist train`` on the
real stack (vLLM CPU, Ray, DeepSpeed), faults sent from outside by pid as a user or the OOM
killer would. Each run prints how long each detection took (``pytest -s``: the HANG-TABLE lines
of benchmarks/NOTES.md). Heartbeats here: every 2 s, hung after 20 s (the defaults: 5 s, 60 s).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from grpo_dist.run.outputs import METRICS_FILE, read_metrics

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow
TIMEOUT = 20


def start(model_dir: Path, out: Path, *extra: str) -> subprocess.Popen:
    args = ["--config", "configs/tiny_cpu.yaml", "--model.path", str(model_dir), "--model.make_if_missing", "null",
            "--output_dir", str(out), "--rollout.num_workers", "1", "--rollout.prompts_per_step", "4",
            "--rollout.group_size", "4", "--trainer.eval_before_after", "false", "--checkpoint.every", "1",
            "--logging.wandb_mode", "disabled", "--logging.progress", "false", "--cluster.max_restarts", "5",
            "--cluster.heartbeat_interval_s", "2", "--cluster.heartbeat_timeout_s", str(TIMEOUT), *extra]
    out.mkdir(parents=True, exist_ok=True)
    return subprocess.Popen([sys.executable, "-m", "grpo_dist.cli", "train", *args], cwd=ROOT,
                            stdout=open(out.parent / "stdout.txt", "w"), stderr=open(out.parent / "stderr.txt", "w"),
                            text=True)


def steps_done(out: Path) -> list[dict]:
    return read_metrics(out) if (out / METRICS_FILE).exists() else []


STEPS = 60  # per run: steps are left after the last fault even where a step takes well under a second
GENERATING = ("ray::RolloutActor.generate", "ray::RolloutActor.heartbeat")  # the title flips while it generates


def procs(driver: subprocess.Popen, title: str | tuple, exact: bool = False) -> list[psutil.Process]:
    """The run's processes whose title is (or starts with) ``title`` (Ray sets ``ray::Role.method``)."""
    found, titles = [], (title,) if isinstance(title, str) else title
    try:
        children = psutil.Process(driver.pid).children(recursive=True)
    except psutil.NoSuchProcess:  # the run ended: wait_for says so
        return []
    for p in children:
        try:
            t = " ".join(p.cmdline()).strip()
            if (t in titles if exact else t.startswith(titles)) and p.status() != psutil.STATUS_ZOMBIE:
                found.append(p)
        except psutil.NoSuchProcess:
            continue
    return found


def pick(driver: subprocess.Popen, preferred: str | tuple, fallback: str, limit: float = 5) -> psutil.Process:
    """A process titled ``preferred`` (e.g. generating) if one shows within ``limit`` s (a tiny
    model's generation can be shorter than a poll), else any titled ``fallback``."""
    try:
        return wait_for(lambda: procs(driver, preferred), driver, limit=limit, what=str(preferred))[0]
    except AssertionError:
        return wait_for(lambda: procs(driver, fallback), driver, what=fallback)[0]


def wait_for(cond, driver: subprocess.Popen, limit: float = 900, what: str = ""):
    end = time.monotonic() + limit
    while time.monotonic() < end:
        got = cond()
        if got:
            return got
        assert driver.poll() is None, f"the run ended while waiting for {what}"
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def replacements(out: Path) -> int:
    return (out.parent / "stderr.txt").read_text().count("-- replacing it (restart ")


def hit(driver: subprocess.Popen, out: Path, after_step: int, title: str | tuple, sig: int,
        exact: bool = False, idle_wait: float = 900, fallback: str | None = None) -> float:
    """Once ``after_step`` steps are done, send ``sig`` to the first process titled ``title``
    (waiting at most ``idle_wait`` s for it, then any process of the role); the seconds until the
    driver logs that it replaces the actor."""
    wait_for(lambda: len(steps_done(out)) >= after_step, driver, what=f"step {after_step}")
    try:
        p = wait_for(lambda: procs(driver, title, exact), driver, limit=idle_wait, what=str(title))[0]
    except AssertionError:
        p = wait_for(lambda: procs(driver, fallback or title), driver, what=str(fallback or title))[0]
    before = replacements(out)
    os.kill(p.pid, sig)
    t0 = time.monotonic()
    wait_for(lambda: replacements(out) > before, driver, what=f"{title} replaced")
    took = time.monotonic() - t0
    print(f"\nHANG-TABLE | {signal.Signals(sig).name} {title} (pid {p.pid}) after step {after_step} | "
          f"replacement logged after {took:.0f} s")
    return took


def finish(driver: subprocess.Popen, out: Path, limit: float = 900) -> tuple[int, str]:
    try:
        rc = driver.wait(limit)
    except subprocess.TimeoutExpired:
        driver.kill()
        raise
    return rc, (out.parent / "stderr.txt").read_text() + (out.parent / "stdout.txt").read_text()


def stop_after(driver: subprocess.Popen, out: Path, more: int = 2) -> tuple[int, str]:
    """Once ``more`` steps have finished after the last fault's replacement, stop the run as a user
    would (SIGINT: the step in flight finishes, a checkpoint, exit 130): the steps left of STEPS
    only bound a fast machine's run, where faults land before a step ends."""
    target = len(steps_done(out)) + more
    wait_for(lambda: driver.poll() is not None or len(steps_done(out)) >= target, driver, what=f"step {target}")
    if driver.poll() is not None:  # a fast machine ran all STEPS meanwhile: it must have ended well
        rc, text = finish(driver, out)
        assert rc == 0, text[-4000:]
        return rc, text
    driver.send_signal(signal.SIGINT)
    rc, text = finish(driver, out, limit=300)
    assert rc == 130 and "interrupted (SIGINT) at step" in text, text[-4000:]
    return rc, text


def check_no_group_lost(out: Path, restarts: int) -> None:
    """Every step done, 1..n without a gap, trained on all 16 completions, after ``restarts``
    replacements."""
    done = steps_done(out)
    assert [int(m["step"]) for m in done] == list(range(1, len(done) + 1))
    assert all(m["rollout/num_completions"] == 16 for m in done)  # 4 prompts x 4, every step
    assert done[-1]["cluster/restarts"] == restarts


def wait_steps_after_last_fault(driver: subprocess.Popen, out: Path, more: int = 2) -> None:
    """Until ``more`` steps have finished after the last fault's replacement (STEPS bounds a fast
    machine's run, where faults land before a step ends: it must still be running)."""
    target = len(steps_done(out)) + more
    wait_for(lambda: len(steps_done(out)) >= target, driver, what=f"step {target}")


def stop_learner(driver: subprocess.Popen, out: Path) -> tuple[int, str, float]:
    """SIGSTOP the learner rank; the run's exit code and output, and the seconds until it exited."""
    p = wait_for(lambda: procs(driver, "ray::LearnerActor"), driver, what="the learner")[0]
    os.kill(p.pid, signal.SIGSTOP)
    t0 = time.monotonic()
    try:
        rc, text = finish(driver, out, limit=300)
    finally:
        try:
            os.kill(p.pid, signal.SIGKILL)
        except OSError:
            pass
    took = time.monotonic() - t0
    print(f"\nHANG-TABLE | SIGSTOP of the learner rank | exit {rc} in {took:.0f} s")
    return rc, text, took


def check_learner_hang_line(rc: int, text: str, took: float, out: Path) -> None:
    assert rc == 1, text[-4000:]
    line = next(x for x in text.splitlines() if x.startswith("error: "))
    assert line.startswith("error: learner worker 0: no heartbeat for "), line
    assert line.endswith(f"resume with: grpo-dist train --config {out / 'config.yaml'} --checkpoint.resume auto")
    assert took < TIMEOUT + 60


@pytest.mark.budget(480)  # 173 s on 2 cores (2026-11-29) before the learner's hang joined it: four faults, three waited out
def test_hung_and_killed_engine_a_hung_reward_actor_then_a_hung_learner(pretrained_model_dir, tmp_path):
    """One run, the engine in the rollout actor's process (the CPU default): SIGSTOP it
    mid-generation (silent: hung after the heartbeat timeout), SIGKILL it between steps (a dead
    actor), SIGSTOP the reward actor; each replaced, its work sent again, 0 groups lost. Then
    SIGSTOP the learner rank: no replacement for a rank, the run stops with one line naming it and
    the command that resumes."""
    out = tmp_path / "run"
    # enough steps that the run is still going when the last fault lands on a quiet machine, where
    # a step takes well under a second (each search for a target falls back after 5 s)
    driver = start(pretrained_model_dir, out, "--trainer.steps", str(STEPS))
    try:
        stop = hit(driver, out, 1, GENERATING, signal.SIGSTOP, idle_wait=5, fallback="ray::RolloutActor")
        # each next fault once a step has finished after the last replacement (a tiny step is
        # shorter than a fresh engine's start: the faults would overlap)
        kill = hit(driver, out, len(steps_done(out)) + 1, "ray::RolloutActor", signal.SIGKILL, exact=True,
                   idle_wait=5, fallback="ray::RolloutActor")
        after = len(steps_done(out)) + 1
        reward = hit(driver, out, after, "ray::RewardActor", signal.SIGSTOP)  # idle: found at its next call
        wait_steps_after_last_fault(driver, out)
        rc, text, took = stop_learner(driver, out)
    finally:
        if driver.poll() is None:
            driver.kill()
    assert TIMEOUT <= stop < TIMEOUT + 30 and kill < 60 and TIMEOUT <= reward < TIMEOUT + 30
    assert "no heartbeat for" in text and "replacing it (restart 3 of 5)" in text
    check_no_group_lost(out, 3)
    check_learner_hang_line(rc, text, took, out)


@pytest.mark.heavy  # make test-all: in make test, test_pipeline_e2e.py (killed, and while starting) and test_stream_e2e.py (stopped)
def test_killed_and_stopped_engine_processes_outside_the_actor(pretrained_model_dir, tmp_path):
    """rollout.engine_in_process false: vLLM's engine core (VLLM::EngineCore) and its CPU worker
    (VLLM::Worker) are child processes of the actor. SIGKILL the engine core mid-generation (found
    by the heartbeat, an engine process gone, or by vLLM's own error); then, while each replacement's
    engine is still starting, SIGKILL its engine core (the start fails: the engine process lost, the
    actor replaced again) and SIGSTOP the next one's worker (the start would wait forever: the
    heartbeat reports the worker stopped); then SIGKILL the engine core between steps. 4
    replacements, 0 groups lost."""
    out = tmp_path / "run"  # 20 steps at most: the last two faults land while engines start, no steps pass meanwhile
    driver = start(pretrained_model_dir, out, "--trainer.steps", "20", "--rollout.engine_in_process", "false")
    try:
        wait_for(lambda: len(steps_done(out)) >= 1, driver, what="step 1")
        pick(driver, GENERATING, "ray::RolloutActor")
        first = procs(driver, "VLLM::EngineCore")[0].pid
        mid = hit(driver, out, 1, "VLLM::EngineCore", signal.SIGKILL)
        starting = []
        for title, sig in (("VLLM::EngineCore", signal.SIGKILL), ("VLLM::Worker", signal.SIGSTOP)):
            seen = {p.pid for p in procs(driver, title)} | {first}
            before = replacements(out)
            p = wait_for(lambda: [q for q in procs(driver, title) if q.pid not in seen], driver,
                         what=f"the replacement's {title}")[0]
            time.sleep(1)  # as the OOM killer would: not in its first instant (StartWatch records it within 0.1 s)
            os.kill(p.pid, sig)  # the replacement's engine is still starting (its actor set-up not answered)
            t0 = time.monotonic()
            wait_for(lambda: replacements(out) > before, driver, what=f"{title} replaced while it started")
            starting.append(time.monotonic() - t0)
            print(f"\nHANG-TABLE | {signal.Signals(sig).name} {title} of a starting replacement | "
                  f"replacement logged after {starting[-1]:.0f} s")
        # and between steps, on the third replacement once it has trained a step
        idle = hit(driver, out, len(steps_done(out)) + 1, "VLLM::EngineCore", signal.SIGKILL)
        rc, text = stop_after(driver, out)
    finally:
        if driver.poll() is None:
            driver.kill()
    assert mid < 30 and idle < 30 and all(t < TIMEOUT for t in starting), (mid, idle, starting)
    # found by the heartbeat ("engine process ... gone") or by vLLM's own error ("engine dead"), whichever first
    assert "engine process" in text and "replacing it (restart 4 of 5)" in text
    assert "while the engine started" in text and "VLLM::Worker (pid" in text
    check_no_group_lost(out, 4)


@pytest.mark.heavy  # make test-all: Ctrl-C saving and naming the resume command: test_resume_exact.py in make test
def test_ctrl_c_during_a_hang_stops_with_the_last_checkpoint(pretrained_model_dir, tmp_path):
    out = tmp_path / "run"
    driver = start(pretrained_model_dir, out, "--trainer.steps", str(STEPS), "--cluster.heartbeat_timeout_s", "600")
    try:
        wait_for(lambda: len(steps_done(out)) >= 2, driver, what="step 2")
        p = pick(driver, GENERATING, "ray::RolloutActor")
        os.kill(p.pid, signal.SIGSTOP)
        time.sleep(3)
        t0 = time.monotonic()
        driver.send_signal(signal.SIGINT)
        rc, text = finish(driver, out, limit=120)
        took = time.monotonic() - t0
    finally:
        if driver.poll() is None:
            driver.kill()
    print(f"\nHANG-TABLE | Ctrl-C while the engine is stopped | exit {rc} in {took:.0f} s")
    assert rc == 130 and took < 30, text[-4000:]
    done = len(steps_done(out))
    ckpt = out / "checkpoints" / f"step_{done:06d}"
    assert (ckpt / "trainer_state.json").is_file()
    # the stream position saved is after the trained steps' prompts only: the step in flight is
    # generated again on resume (docs/reproducibility.md)
    assert json.loads((ckpt / "trainer_state.json").read_text())["data"]["index"] == done * 4
    line = next(x for x in text.splitlines() if x.startswith("interrupted (SIGINT)"))
    # the checkpoint of step `done` written now, or (stopped while the engines loaded step done+1's
    # weights, which the learner holds) the one written at step `done`, named
    assert f"at step {done} (" in line and str(ckpt) in line, line
    assert f"; step {done + 1} dropped: rollout worker 0: no heartbeat for " in line, line
    assert line.endswith(f"resume with: grpo-dist train --config {out / 'config.yaml'} --checkpoint.resume auto")
