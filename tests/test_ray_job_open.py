"""A training run submitted as a Ray job to a cluster without token authentication (issue 55.2): a
head started by a plain `ray start --head` with Ray's defaults, as KubeRay or a hand-made cluster
runs it, on 127.0.0.1 with free ports, stopped by launch/stop_cluster.sh (tests/cluster_scripts.py).

launch/submit_job.sh asks the job server whether it needs a token: this one does not, so it says
so in one line and sends none, not even the one it finds here (another cluster's). The token
cluster's job path: test_ray_job.py. Also: no job server is one line; the SLURM example uses the
launch scripts (read, since SLURM is not here).
"""

from __future__ import annotations

import json
import re
import subprocess
import time
import urllib.request

import pytest

from cluster_scripts import ONE_STEP, ROOT, job_record, start_open_head, stop, user_env
from grpo_dist.util.ports import free_port

OPEN = "takes any client (no token authentication)"


@pytest.mark.slow
def test_submit_job_trains_on_a_cluster_without_token_authentication(pretrained_model_dir, tmp_path):
    head = start_open_head(tmp_path / "home")
    try:
        deadline = time.time() + 120
        while True:  # the job server answers without a token: an open cluster
            try:
                urllib.request.urlopen(f"{head.url}/api/version", timeout=2)
                break
            except OSError:
                assert time.time() < deadline, "the job server did not come up in 120 s"
                time.sleep(1)
        other = tmp_path / "other_cluster_token"  # a token of another cluster, found by the script
        other.write_text("e" * 64)
        proj = tmp_path / "proj"
        proj.mkdir()
        (proj / "my.yaml").write_text((ROOT / "configs" / "tiny_cpu.yaml").read_text())
        r = subprocess.run(["bash", str(ROOT / "launch" / "submit_job.sh"), "my.yaml", *ONE_STEP,
                            "--model.path", str(pretrained_model_dir), "--output_dir", "runs/job"],
                           cwd=proj, env=dict(head.env, RAY_ADDRESS=head.url, RAY_AUTH_TOKEN_PATH=str(other)),
                           capture_output=True, text=True, timeout=600)
        out = r.stdout + r.stderr
        assert r.returncode == 0 and "succeeded" in out, r.stdout[-3000:] + r.stderr[-3000:]
        warned = [ln for ln in r.stderr.splitlines() if OPEN in ln]
        assert len(warned) == 1 and warned[0].startswith(f"warning: the Ray cluster at {head.url} "), r.stderr[-2000:]
        assert json.loads((proj / "runs" / "job" / "summary.json").read_text())["steps"] == 1
        # no token travelled: the job's environment, read without one (as every client can here)
        job_id = re.search(r"Job '([^']+)' submitted successfully", out).group(1)
        env_vars = job_record(head.url, job_id)["runtime_env"]["env_vars"]
        assert "e" * 64 not in out and "RAY_AUTH_TOKEN" not in env_vars and "RAY_AUTH_MODE" not in env_vars, env_vars
        assert env_vars["GRPO_DIST_SUBMIT_DIR"] == str(proj)
        # followed as Ray's CLI follows an open cluster's jobs (no RAY_AUTH_MODE)
        r = subprocess.run(["ray", "job", "status", job_id], env=dict(head.env, RAY_ADDRESS=head.url),
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 0 and "succeeded" in (r.stdout + r.stderr).lower(), r.stdout[-2000:] + r.stderr[-2000:]
    finally:
        r, _ = stop(head)  # the head we started, and only it
        assert r.returncode == 0, r.stdout + r.stderr


def test_submit_job_without_a_job_server_is_one_line(tmp_path):
    """Nothing answering at RAY_ADDRESS: exit 2, one line naming the address, before anything is staged."""
    url = f"http://127.0.0.1:{free_port()}"
    r = subprocess.run(["bash", str(ROOT / "launch" / "submit_job.sh"), "configs/tiny_cpu.yaml"], cwd=ROOT,
                       env=user_env(tmp_path, RAY_ADDRESS=url), capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and f"no Ray job server at {url}" in r.stderr, r.stderr
    assert "uploading" not in r.stdout


def test_the_slurm_example_runs_the_launch_scripts():
    """launch/slurm_example.sbatch (no SLURM here: read, and parsed by bash) starts, submits and stops
    through the launch scripts with token authentication, never an open `ray start` of its own."""
    path = ROOT / "launch" / "slurm_example.sbatch"
    text = "\n".join(ln.split("#", 1)[0] for ln in path.read_text().splitlines())  # commands, not comments
    assert subprocess.run(["bash", "-n", str(path)], capture_output=True).returncode == 0
    assert "ray start" not in text and re.findall(r"RAY_AUTH_MODE=(\w+)", text) == ["token"], text
    for script in ("launch/start_head.sh", "launch/start_worker.sh", "launch/submit_job.sh"):
        assert script in text, script
    assert text.count("--block") == 2  # each node's start script stays up; SIGTERM at the end stops its node
