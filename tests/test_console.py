"""What a user reads, through the CLI and a pipe (not a terminal): quiet by default (the actors'
vLLM/Ray/DeepSpeed output in <output_dir>/workers.log), no ANSI colour codes, no line printed twice;
one run per output_dir (a second run into a live run's directory exits 2 with one line; a lock
left by a dead run is taken over with a warning); a resumed run's summary covers the whole run
(wall time, every W&B segment); the adapter names its
base by an absolute path; `grpo-dist eval` prints a table and writes the JSON to a file;
`grpo-dist doctor` prints one PASS/FAIL line per check, and a learner's process group compiles
nothing.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from grpo_dist.run.lock import LOCK_FILE
from test_output_lock import _write_lock

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[1]
ANSI = re.compile(r"\x1b\[")


def _cli(args: list[str], cwd: Path, env: dict | None = None, timeout: int = 1200) -> tuple[int, str, float]:
    """``python -m grpo_dist.cli ARGS`` with stdout and stderr into one pipe, as `| cat` shows them."""
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "grpo_dist.cli", *args], cwd=cwd, stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True, timeout=timeout,
                       env=env or dict(os.environ, PYTHONPATH=str(ROOT)))
    return r.returncode, r.stdout, time.monotonic() - t0


def _read_as_a_user(out: str) -> list[str]:
    assert not ANSI.search(out), [ln for ln in out.splitlines() if ANSI.search(ln)][:5]
    lines = [ln for ln in out.splitlines() if ln.strip()]
    twice = {ln: n for ln, n in Counter(lines).items() if n > 1}
    assert not twice, twice
    return lines


SMALL = ["--rollout.num_workers", "1", "--rollout.prompts_per_step", "4", "--rollout.group_size", "4",
         "--data.eval_size", "8", "--eval.samples_per_prompt", "2", "--eval.pass_k", "[1, 2]",
         "--learner.micro_batch_size", "16", "--logging.sample_table_every", "0", "--checkpoint.every", "1"]


def test_train_resume_and_eval_as_a_user_reads_them(pretrained_model_dir, tmp_path):
    proj = tmp_path / "proj"  # the user's directory; the model given relative to it
    (proj / "models").mkdir(parents=True)
    (proj / "models" / "base").symlink_to(pretrained_model_dir)
    cfg = str(ROOT / "configs" / "tiny_cpu.yaml")
    args = ["train", "--config", cfg, "--model.path", "models/base", "--output_dir", "runs/x", "--trainer.steps", "2",
            *SMALL]
    run = proj / "runs" / "x"
    t0 = time.monotonic()
    first = subprocess.Popen([sys.executable, "-m", "grpo_dist.cli", *args], cwd=proj, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    try:
        # one run per output_dir: a second run into the live run's directory exits 2 with one line
        while not (run / LOCK_FILE).exists() and first.poll() is None and time.monotonic() - t0 < 300:
            time.sleep(0.2)
        assert (run / LOCK_FILE).exists(), "the first run never took the lock"
        rc, out, took = _cli(args, proj, timeout=300)
        assert first.poll() is None, "the first run must still be running"
        lines = [ln for ln in out.splitlines() if ln.strip()]
        assert rc == 2 and len(lines) == 1 and re.fullmatch(
            rf"config error: output_dir: {run} is in use by another run \(pid {first.pid} on this host, started "
            rf"\S+: .*grpo_dist\.cli train .*\); wait for it to end or stop it, or choose another output_dir",
            lines[0]), out
        print(f"\nbad input | output_dir in use by a live run | {lines[0]} | {took:.1f} s")
        out, _ = first.communicate(timeout=1200)
    finally:
        if first.poll() is None:
            first.kill()
    rc, took = first.returncode, time.monotonic() - t0
    assert rc == 0, out[-3000:]
    assert not (run / LOCK_FILE).exists()
    lines = _read_as_a_user(out)
    # quiet: the actors' output (vLLM engine warnings among it) is in the log file, not here
    assert not [ln for ln in lines if re.match(r"\((RolloutActor|LearnerActor|RewardActor|raylet)", ln)], lines
    assert not [ln for ln in lines if "WARNING" in ln or "Warning" in ln], lines
    log = (run / "workers.log").read_text()
    assert "(RolloutActor pid=" in log and "vllm" in log.lower() and not ANSI.search(log)
    assert any(ln.startswith(f"logs      {run / 'workers.log'} ") for ln in lines), lines
    assert len(lines) <= 25, "\n".join(lines)
    # one held-out set evaluated in seconds: no line per phase (only a long evaluation has one)
    assert not [ln for ln in lines if "sampled completions in" in ln], lines
    print(f"first segment: exit {rc}, {took:.0f} s, {len(lines)} lines:\n" + "\n".join(lines))
    first = json.loads((run / "summary.json").read_text())
    assert first["segments"] == 1 and len(first["wandb_dirs"]) == 1
    adapter_cfg = json.loads((run / "adapter" / "adapter_config.json").read_text())
    assert adapter_cfg["base_model_name_or_path"] == str(proj / "models" / "base")  # absolute, as given

    # resumed: one more step from the step-2 checkpoint, over a lock left by a run that died holding it
    dead = json.loads(_write_lock(run).read_text())["pid"]
    rc, out, took = _cli(["train", "--config", str(run / "config.yaml"), "--checkpoint.resume", "auto",
                          "--trainer.steps", "3"], proj)
    assert rc == 0, out[-3000:]
    assert f"warning: output_dir: taking over {run / LOCK_FILE} left by pid {dead} on this host" in out
    assert "resumed from step 2" in out and not (run / LOCK_FILE).exists()
    lines = _read_as_a_user(out)
    print(f"resumed segment: exit {rc}, {took:.0f} s, {len(lines)} lines:\n" + "\n".join(lines))
    summary = json.loads((run / "summary.json").read_text())
    assert summary["steps"] == 3 and summary["segments"] == 2
    # the whole run: the first segment's time up to its last checkpoint, plus this one
    assert summary["wall_seconds"] >= summary["wall_seconds_this_segment"] + 0.5 * first["wall_seconds"]
    dirs = summary["wandb_dirs"]
    assert len(dirs) == 2 and all(Path(d).is_dir() for d in dirs) and dirs[0] in first["wandb_dirs"]
    assert f"wandb sync {dirs[0]} {dirs[1]}" in out  # one command uploads both segments
    assert "over 2 segments" in out

    # eval: the table, and the JSON in a file
    rc, out, took = _cli(["eval", "--config", str(run / "config.yaml"), "--adapter", str(run / "adapter"),
                          "--rollout.backend", "hf", "--out", "eval.json"], proj)
    assert rc == 0, out[-3000:]
    lines = _read_as_a_user(out)
    print(f"eval: exit {rc}, {took:.0f} s, {len(lines)} lines:\n" + "\n".join(lines))
    assert not [ln for ln in lines if ln.lstrip().startswith(("{", "}", '"'))], lines  # no JSON on the console
    header = next(ln for ln in lines if "adapter" in ln and "delta" in ln)
    assert "8 held-out prompts, 2 samples each" in header
    rows = {ln.split()[0]: ln.split()[1:] for ln in lines[lines.index(header) + 1:] if ln.split()}
    for key in ("sampled_acc", "greedy_acc", "pass@1", "pass@2", "mean_reward"):
        base, adapted, delta = (float(x) for x in rows[key])
        assert abs(adapted - base - delta) < 2e-3, (key, rows[key])
    report = json.loads((proj / "eval.json").read_text())
    assert abs(report["adapter_eval"]["sampled_accuracy"] - float(rows["sampled_acc"][1])) < 1e-3
    assert f"report: {proj / 'eval.json'}" in out and len(lines) <= 20


def _doctor_env(home: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("GRPO_DIST_CACHE", "TORCH_EXTENSIONS_DIR",
                                                            "XDG_CACHE_HOME")}
    return dict(env, HOME=str(home), PYTHONPATH=str(ROOT))


def test_doctor_checks_and_a_learner_group_that_compiles_nothing(tmp_path):
    """A fresh home (no caches at all): every check passes from two directories, the learner's
    process group starts without compiling DeepSpeed's C++ op (nothing written under the home's
    caches or the current directory)."""
    home = tmp_path / "home"
    env = _doctor_env(home)
    for where in ("a", "b"):
        (tmp_path / where).mkdir()
        rc, out, took = _cli(["doctor"] + (["--quick"] if where == "b" else []), tmp_path / where, env=env,
                             timeout=1200)
        lines = _read_as_a_user(out)
        print(f"doctor from {where}: exit {rc}, {took:.0f} s:\n{out}")
        assert rc == 0, out
        checks = [ln for ln in lines if ln.startswith(("PASS", "FAIL"))]
        names = {ln.split()[1] for ln in checks}
        want = {"versions", "cpu", "gpus", "deepspeed"} | ({"ray", "vllm"} if where == "a" else set())
        assert names == want and all(ln.startswith("PASS") for ln in checks), checks
        ds = next(ln for ln in checks if ln.split()[1] == "deepspeed")
        assert "a gloo process group in" in ds and "nothing compiled" in ds, ds
        assert not (tmp_path / where / ".cache").exists()  # nothing in the current directory
    assert not list(home.rglob("*shm_comm*")) and not list(home.rglob("*.so")), sorted(home.rglob("*"))[:20]
