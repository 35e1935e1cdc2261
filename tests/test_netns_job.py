"""The tiny config as a user runs it on three real hosts (netns hosts, tests/netns_cluster.py):
head on host 1, workers on hosts 2 and 3 (launch scripts, token authentication), the job submitted
with launch/submit_job.sh from the operator's machine outside the hosts.

    host 1  10.213.78.11  head, the job's driver, learner rank 0     {learner: 1}
    host 2  10.213.78.12  learner rank 1                             {learner: 1}
    host 3  10.213.78.13  2 vLLM rollout engines, the reward actor   {gen: 2, reward_slot: 1}

Full-weight training (two learner ranks on two hosts: DeepSpeed over gloo on TCP between their
addresses) with `sync.transport: collective` (learner rank 0 on host 1 broadcasts to the engines
on host 3). The outputs live in the hosts' shared directory (`cluster.shared_dir`). Then all of
host 2's processes killed mid-run (learner rank 1): the run stops with one line and the resume
command; and a host whose mount of that directory is missing (a private, empty directory in its
place): the run is refused at start with one line.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest
import wandb_tables

from netns_cluster import start_cluster, start_worker
from netns_hosts import ROOT, hosts_fixture

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def hosts():
    yield from hosts_fixture(3)


@pytest.fixture(scope="module")
def cluster(hosts, tmp_path_factory):
    c = start_cluster(hosts, {1: {"learner": 1}, 2: {"learner": 1}, 3: {"gen": 2, "reward_slot": 1}},
                      {1: 2, 2: 1, 3: 2}, tmp_path_factory.mktemp("operator"))
    yield c
    c.stop()


def _operator_dir(hosts, pretrained_model_dir):
    """The submitter's directory, on the shared mount (a relative output_dir resolves there, on the
    driver's host): the config and the model, as a user keeps them."""
    op = hosts.shared / "op"
    (op / "configs").mkdir(parents=True, exist_ok=True)
    shutil.copy(ROOT / "configs/tiny_cpu.yaml", op / "configs/tiny_cpu.yaml")
    if not (op / "models/tiny-add").exists():
        shutil.copytree(pretrained_model_dir, op / "models/tiny-add")
    return op


def _args(hosts, out: str, steps: int) -> list[str]:
    return ["configs/tiny_cpu.yaml", "--output_dir", out, "--model.path", "models/tiny-add",
            "--model.make_if_missing", "null", "--cluster.num_cpus", "null", "--cluster.shared_dir", str(hosts.shared),
            "--lora.enabled", "false", "--sync.transport", "collective", "--learner.num_learners", "2",
            "--learner.zero_stage", "2", "--cluster.learner_resources", "{learner: 1}",
            "--cluster.learner_strategy", "STRICT_SPREAD", "--cluster.rollout_resources", "{gen: 1}",
            "--cluster.reward_resources", "{reward_slot: 1}", "--cluster.actor_start_timeout_s", "600",
            "--trainer.steps", str(steps), "--trainer.eval_before_after", "false", "--logging.progress", "false",
            "--rollout.prompts_per_step", "4", "--rollout.group_size", "4", "--learner.micro_batch_size", "16",
            "--checkpoint.every", "1", "--logging.sample_table_every", "0"]


def test_tiny_config_runs_with_learner_ranks_on_two_hosts_and_engines_on_a_third(hosts, cluster,
                                                                                   pretrained_model_dir):
    op = _operator_dir(hosts, pretrained_model_dir)
    t0 = time.monotonic()
    # relative, as a user types it: resolved against the submitter's directory (inside shared_dir),
    # also by the config's check that full weights write their checkpoints there
    r = cluster.submit(op, *_args(hosts, "runs/job", 2))
    took = time.monotonic() - t0
    print(f"submit_job.sh: exit {r.returncode} after {took:.0f} s")
    out = op / "runs" / "job"
    assert (out / "summary.json").is_file(), r.stdout[-5000:] + r.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps"] == 2
    a = hosts.addr
    assert summary["hosts"]["driver"] == [a(1)], summary["hosts"]
    assert sorted(summary["hosts"]["learner"]) == [a(1), a(2)], summary["hosts"]  # two ranks, two hosts
    assert summary["hosts"]["rollout"] == [a(3), a(3)] and summary["hosts"]["reward"] == [a(3)], summary["hosts"]
    assert f"hosts     driver {a(1)}" in r.stdout
    assert r.returncode == 0, r.stdout[-3000:]
    # the weights reached the engines on host 3 by the collective, version by version
    metrics = [json.loads(ln) for ln in (out / "metrics.jsonl").read_text().splitlines()]
    assert [m.get("sync/buckets", 0) > 0 for m in metrics] == [True, True], metrics
    (log,) = Path(summary["wandb_dir"]).glob("*.wandb")
    wb = {}
    for rec in wandb_tables.finished_records(log):
        if rec.WhichOneof("record_type") == "summary":
            wb.update({it.key or "/".join(it.nested_key): json.loads(it.value_json) for it in rec.summary.update})
    assert wb.get("hosts/learner", "").split() == summary["hosts"]["learner"], sorted(wb)


def test_a_learner_host_killed_mid_run_stops_with_one_line_and_the_resume_command(hosts, cluster,
                                                                                  pretrained_model_dir):
    """All of host 2's processes (learner rank 1) killed after step 2: DeepSpeed's process group
    cannot take a newcomer, so the run stops with one line naming the rank, the last checkpoint
    and the resume command, within a bound."""
    import threading

    op = _operator_dir(hosts, pretrained_model_dir)
    out, done = op / "runs" / "killed", {}
    job = threading.Thread(target=lambda: done.update(r=cluster.submit(op, *_args(hosts, "runs/killed", 40))))
    job.start()
    deadline = time.monotonic() + 900
    while time.monotonic() < deadline and job.is_alive():
        f = out / "metrics.jsonl"
        if f.exists() and len(f.read_text().splitlines()) >= 2:
            break
        time.sleep(0.5)
    assert job.is_alive(), done.get("r") and done["r"].stdout[-3000:]
    assert hosts.script("kill", "2").returncode == 0
    t0 = time.monotonic()
    job.join(600)
    took, r = time.monotonic() - t0, done["r"]
    steps = len((out / "metrics.jsonl").read_text().splitlines())
    lines = sorted({ln.strip() for ln in (r.stdout + r.stderr).splitlines() if ln.strip().startswith("error: ")})
    print(f"host 2 killed after step 2: the job ended {took:.0f} s later, after step {steps}: {lines}")
    assert r.returncode != 0 and took < 180, (took, r.stdout[-3000:])
    assert len(lines) == 1 and lines[0].startswith("error: learner worker 1"), lines
    assert f"the last checkpoint is {out / 'checkpoints'}" in lines[0], lines[0]
    assert lines[0].endswith(f"resume with: grpo-dist train --config {out / 'config.yaml'} --checkpoint.resume auto")
    assert steps < 40


def test_a_host_without_the_shared_mount_is_refused_at_start_in_one_line(hosts, cluster, pretrained_model_dir):
    """Host 2's worker restarted with a private, empty directory where the shared one should be."""
    r = cluster.on(2, "bash", str(ROOT / "launch/stop_cluster.sh"), timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert hosts.script("private", "2", str(hosts.shared)).returncode == 0
    start_worker(cluster, 2, json.dumps({"host2": 1, "learner": 1}), 1)
    op = _operator_dir(hosts, pretrained_model_dir)
    t0 = time.monotonic()
    r = cluster.submit(op, *_args(hosts, str(op / "runs/refused"), 2), timeout=600)
    took = time.monotonic() - t0
    errors = [ln for ln in r.stdout.splitlines() + r.stderr.splitlines() if "config error: cluster.shared_dir" in ln]
    print(f"refused after {took:.0f} s: {errors}")
    # one line (`ray job submit` shows the job's last logs again when it fails: the same line twice)
    assert len(set(errors)) == 1 and f"({hosts.addr(2)})" in errors[0], r.stdout[-3000:] + r.stderr[-3000:]
    assert not (op / "runs" / "refused" / "summary.json").exists()
