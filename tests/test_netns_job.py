"""The tiny config as a user runs it on three real hosts (netns hosts, tests/netns_cluster.py):
head on host 1, workers on hosts 2 and 3 (launch scripts, token authentication), the job submitted
with launch/submit_job.sh from the operator's machine outside the hosts. First the cluster itself:
each node runs its tasks on its own address, with its own /tmp and Ray session directory, and a
driver without the token is refused.

    host 1  10.213.78.11  head, the job's driver, learner rank 0     {learner: 1}
    host 2  10.213.78.12  learner rank 1                             {learner: 1}
    host 3  10.213.78.13  2 vLLM rollout engines, the reward actor   {gen: 2, reward_slot: 1}
    host 4  10.213.78.14  joins later, in place of host 3             {gen: 2, reward_slot: 1}

Full-weight training (two learner ranks on two hosts: DeepSpeed over gloo on TCP between their
addresses) with `sync.transport: collective` (learner rank 0 on host 1 broadcasts to the engines
on host 3). The outputs live in the hosts' shared directory (`cluster.shared_dir`). Then host 3's
link taken down mid-run: its engines and reward actor are replaced on host 4, which joins the
cluster after the fault as an autoscaler's new node would, and the run finishes with no group
lost. Then all of host 2's processes killed mid-run (learner rank 1): the run stops with one line and the resume
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

from grpo_dist.run.outputs import METRICS_FILE, read_metrics
from netns_cluster import WHERE, start_cluster, start_worker
from netns_hosts import ROOT, hosts_fixture

pytestmark = pytest.mark.slow
ROLLOUT_HOST = {"gen": 2, "reward_slot": 1}  # host 3's resources, then host 4's


@pytest.fixture(scope="module")
def hosts():
    yield from hosts_fixture(4)


@pytest.fixture(scope="module")
def cluster(hosts, tmp_path_factory):
    c = start_cluster(hosts, {1: {"learner": 1}, 2: {"learner": 1}, 3: dict(ROLLOUT_HOST)},
                      {1: 2, 2: 1, 3: 2}, tmp_path_factory.mktemp("operator"), started=3)
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


# a lost host found within seconds, not the defaults' minute; a broadcast to it given up after 60 s
FAST_DETECTION = ["--cluster.heartbeat_interval_s", "2", "--cluster.heartbeat_timeout_s", "20",
                  "--sync.timeout_s", "60", "--cluster.max_restarts", "5"]


def test_every_node_runs_on_its_own_host_address_tmp_and_session(hosts, cluster):
    """Before any job: a driver on a worker host finds the cluster through its own node, and a
    task on each node reports that host's address, HOME and a Ray session under its own /tmp."""
    r = cluster.driver(2, WHERE)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    where = json.loads(r.stdout.split("WHERE ", 1)[1])
    assert sorted(where) == ["host1", "host2", "host3"], where  # host 4 joins later
    for i in (1, 2, 3):
        w = where[f"host{i}"]
        assert w["node_ip"] == hosts.addr(i) and w["home"] == str(hosts.home(i)), w
        assert w["session"].startswith("/tmp/ray/session_"), w
        assert (hosts.state / f"h{i}" / "tmp" / w["session"].removeprefix("/tmp/")).is_dir()  # its own /tmp
    assert "note: with a node address other than 127.0.0.1" in cluster.out[1]


def test_a_driver_without_the_token_is_refused(hosts, cluster):
    (hosts.home(3) / ".ray" / "auth_token").rename(hosts.home(3) / ".ray" / "auth_token.away")
    try:
        r = cluster.driver(3, "import ray; ray.init(address='auto'); print('JOINED')", timeout=120)
        assert r.returncode != 0 and "JOINED" not in r.stdout, r.stdout[-2000:]
    finally:
        (hosts.home(3) / ".ray" / "auth_token.away").rename(hosts.home(3) / ".ray" / "auth_token")


def _steps(out: Path) -> list[dict]:
    return read_metrics(out) if (out / METRICS_FILE).exists() else []


def _submit_in_background(cluster, op, *args):
    import threading

    done = {}
    job = threading.Thread(target=lambda: done.update(r=cluster.submit(op, *args)))
    job.start()
    return job, done


def _wait_steps(job, done, out: Path, n: int, limit: float = 900) -> None:
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline and job.is_alive() and len(_steps(out)) < n:
        time.sleep(0.5)
    assert job.is_alive(), done.get("r") and done["r"].stdout[-3000:] + done["r"].stderr[-3000:]
    assert len(_steps(out)) >= n, f"step {n} not reached in {limit} s"


@pytest.mark.heavy  # make test-all: a lost rollout node on simulated nodes is in make test (test_multinode.py)
def test_tiny_config_on_three_hosts_survives_host_3s_link_down_on_a_host_that_joins_later(
        hosts, cluster, pretrained_model_dir):
    """The job as submitted from the operator's machine, with a relative output_dir (resolved against
    the submitter's directory, inside shared_dir, also by the config's check that full weights write
    their checkpoints there). After step 2, host 3 (both engines, the reward actor) is cut off
    (`netns_hosts.sh link 3 down`: its processes live on, unreachable, as behind a dead switch port)
    and host 4 joins with the same resources, as an autoscaler's new node. The driver finds the
    actors gone (the heartbeat, or Ray's node health check, whichever first), waits for Ray to mark
    the silent node dead (so that the placement group's bundles move), and replaces them on host 4;
    the new engines join a new weight group and get the current weights; every step trains on all
    of its groups."""
    steps = 10  # 2 before the fault; the rest need host 4's actors (host 3's are unreachable), so it cannot end early
    op = _operator_dir(hosts, pretrained_model_dir)
    out = op / "runs" / "job"
    t_submit = time.monotonic()
    job, done = _submit_in_background(cluster, op, *_args(hosts, "runs/job", steps), *FAST_DETECTION)
    _wait_steps(job, done, out, 2)
    at_fault = len(_steps(out))
    first = time.monotonic() - t_submit
    assert hosts.script("link", "3", "down").returncode == 0
    t0 = time.monotonic()
    joined = start_worker(cluster, 4, json.dumps({"host4": 1, **ROLLOUT_HOST}), 2)  # the new node
    t_joined = time.monotonic() - t0
    _wait_steps(job, done, out, at_fault + 1, limit=900)
    recovered = time.monotonic() - t0
    job.join(1200)
    took, r = time.monotonic() - t0, done["r"]
    text = r.stdout + r.stderr
    replaced = [ln for ln in text.splitlines() if "-- replacing it (restart " in ln]
    print(f"submit to step 2: {first:.0f} s; host 3's link down after step {at_fault}: host 4 joined after "
          f"{t_joined:.0f} s, the next step done after {recovered:.0f} s, the job ended after {took:.0f} s; "
          f"replacements: {replaced}")
    assert r.returncode == 0, text[-5000:] + joined[-500:]
    assert recovered < 600, recovered  # detection, Ray's verdict on the node, three actors started on host 4
    done_steps = _steps(out)
    assert [int(m["step"]) for m in done_steps] == list(range(1, steps + 1))
    assert all(m["rollout/num_completions"] == 16 for m in done_steps)  # 4 prompts x 4: no group lost
    # 2 engines and the reward actor, each once: none placed on the lost node before Ray gave up on it
    assert done_steps[-1]["cluster/restarts"] == 3 == len(replaced), replaced
    syncs = [m["sync/seconds"] for m in done_steps if "sync/seconds" in m]
    print(f"full-weight sync from host 1 to the engines (collective, gloo over TCP): median "
          f"{sorted(syncs)[len(syncs) // 2]:.3f} s over {len(syncs)} steps, max {max(syncs):.3f} s")
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps"] == steps
    a = hosts.addr
    assert summary["hosts"]["driver"] == [a(1)], summary["hosts"]
    assert sorted(summary["hosts"]["learner"]) == [a(1), a(2)], summary["hosts"]  # two ranks, two hosts
    assert summary["hosts"]["rollout"] == [a(4), a(4)] and summary["hosts"]["reward"] == [a(4)], summary["hosts"]
    assert f"hosts     driver {a(1)}" in r.stdout
    # the weights reached the engines by the collective, version by version, the replaced ones too
    assert all(m.get("sync/buckets", 0) > 0 for m in done_steps), [m.get("sync/buckets") for m in done_steps]
    (log,) = Path(summary["wandb_dir"]).glob("*.wandb")
    wb = {}
    for rec in wandb_tables.finished_records(log):
        if rec.WhichOneof("record_type") == "summary":
            wb.update({it.key or "/".join(it.nested_key): json.loads(it.value_json) for it in rec.summary.update})
    assert wb.get("hosts/learner", "").split() == summary["hosts"]["learner"], sorted(wb)
    assert wb.get("hosts/rollout", "").split() == [a(4), a(4)], sorted(wb)


@pytest.mark.heavy  # make test-all: a lost learner node on simulated nodes is in make test (test_multinode.py)
def test_a_learner_host_killed_mid_run_stops_with_one_line_and_the_resume_command(hosts, cluster,
                                                                                  pretrained_model_dir):
    """All of host 2's processes (learner rank 1) killed after step 2: DeepSpeed's process group
    cannot take a newcomer, so the run stops with one line naming the rank, the last checkpoint
    and the resume command, within a bound."""
    op = _operator_dir(hosts, pretrained_model_dir)
    out = op / "runs" / "killed"
    job, done = _submit_in_background(cluster, op, *_args(hosts, "runs/killed", 40))
    _wait_steps(job, done, out, 2)
    assert hosts.script("kill", "2").returncode == 0
    t0 = time.monotonic()
    job.join(600)
    took, r = time.monotonic() - t0, done["r"]
    steps = len(_steps(out))
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
