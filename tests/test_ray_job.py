"""A training run submitted as a Ray job to a separately started head (`launch/` scripts).

The head is started by `launch/start_head.sh ... --block` in its own process group (token
authentication on, a token file of the test's own) and stopped by that handle only. The HF rollout backend keeps it quick: vLLM on the real stack is
covered by test_e2e.py; this test is about the job path (working_dir shipping, cluster.address
auto, the driver joining an existing cluster).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from grpo_dist.util.ports import free_port

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def ray_head(tmp_path_factory):
    """A head started by launch/start_head.sh (token authentication on, bound to 127.0.0.1), with
    a token file of its own (never ~/.ray/auth_token: other Ray users of this machine)."""
    tmp_path = tmp_path_factory.mktemp("head")
    venv_bin = str(Path(sys.executable).parent)
    token_file = tmp_path / "secret" / "auth_token"
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH")}
    env.update(PATH=f"{venv_bin}:{os.environ.get('PATH', '')}", RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0",
               RAY_AUTH_TOKEN_PATH=str(token_file), HOME=str(tmp_path / "home"))
    port, dash = free_port(), free_port()
    log_path = tmp_path / "head.log"
    proc = subprocess.Popen(
        ["bash", "launch/start_head.sh", "--num-cpus", "2", "--include-dashboard", "true", "--block",
         # fixed defaults (52365, 10001) collide with other heads on a shared machine
         "--dashboard-agent-listen-port", str(free_port()), "--ray-client-server-port", str(free_port())],
        env=dict(env, RAY_PORT=str(port), RAY_DASHBOARD_PORT=str(dash)), stdout=open(log_path, "w"),
        stderr=subprocess.STDOUT, start_new_session=True, cwd=ROOT)
    url = f"http://127.0.0.1:{dash}"
    deadline = time.time() + 120
    while time.time() < deadline:
        try:
            urllib.request.urlopen(f"{url}/api/version", timeout=2)
            pytest.fail("the job server answered a request without the token")
        except urllib.error.HTTPError as e:  # up, and refusing: 401 without a token
            assert e.code == 401, e
            if "Ray runtime started" in log_path.read_text():  # raylet and agents up too
                break
            time.sleep(1)
        except OSError:
            if proc.poll() is not None:
                pytest.fail(f"ray head exited: {log_path.read_text()[-2000:]}")
            time.sleep(1)
    else:
        pytest.fail("ray head's job server did not come up in 120 s")
    yield {"env": env, "url": url, "token_file": token_file, "log": log_path, "pgid": proc.pid, "port": port,
           "dash": dash}
    os.killpg(proc.pid, signal.SIGTERM)  # the head we started, and only it
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)


def _listening(pgid: int) -> list[tuple[str, str]]:
    """(local address, process) of every TCP socket listening in process group ``pgid``."""
    pids = {int(p) for p, g in (ln.split() for ln in subprocess.run(
        ["ps", "-eo", "pid=,pgid="], capture_output=True, text=True).stdout.splitlines()) if int(g) == pgid}
    out = []
    for ln in subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True).stdout.splitlines():
        m = re.search(r'\("([^"]+)",pid=(\d+)', ln)
        if m and int(m.group(2)) in pids:
            out.append((ln.split()[3], m.group(1)))
    return out


def test_head_is_secure_by_default(ray_head):
    """Token made private and never printed; every port on the given address; no token, no job."""
    token_file, env = ray_head["token_file"], ray_head["env"]
    token = token_file.read_text().strip()
    assert len(token) == 64 and oct(token_file.stat().st_mode & 0o777) == "0o600"
    log = ray_head["log"].read_text()
    assert token not in log and f"token from {token_file}" in log and "launch/start_worker.sh 127.0.0.1:" in log
    listening = _listening(ray_head["pgid"])
    names = {p for _, p in listening}
    assert {"gcs_server", "raylet"} <= names, listening
    hosts = {addr.rsplit(":", 1)[0] for addr, _ in listening}
    assert hosts <= {"127.0.0.1", "[::ffff:127.0.0.1]"}, listening  # not 0.0.0.0 / *, not the public IP
    assert f"127.0.0.1:{ray_head['dash']}" in {a for a, _ in listening}
    # the job server refuses a wrong token; a submit without the token is refused
    req = urllib.request.Request(f"{ray_head['url']}/api/jobs/", headers={"Authorization": "Bearer " + "0" * 64})
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, timeout=10)
    assert e.value.code == 403
    no_token = {k: v for k, v in env.items() if k != "RAY_AUTH_TOKEN_PATH"}
    r = subprocess.run(["bash", "launch/submit_job.sh", "configs/tiny_cpu.yaml"], cwd=ROOT, capture_output=True,
                       text=True, timeout=120, env=dict(no_token, RAY_ADDRESS=ray_head["url"]))
    assert r.returncode == 2 and "no cluster token" in r.stderr, r.stderr[-2000:]
    r = subprocess.run(["ray", "job", "submit", "--address", ray_head["url"], "--", "echo", "pwned"], cwd=ROOT,
                       capture_output=True, text=True, timeout=120, env=dict(no_token, RAY_AUTH_MODE="token"))
    assert r.returncode != 0 and "pwned" not in r.stdout and "Authentication" in r.stdout + r.stderr, r.stdout[-2000:]
    # the GCS refuses a client without the token too
    r = subprocess.run([sys.executable, "-c", f"import ray; ray.init(address='127.0.0.1:{ray_head['port']}')"],
                       capture_output=True, text=True, timeout=120, env=dict(no_token, RAY_AUTH_MODE="token"))
    assert r.returncode != 0 and "token" in r.stderr.lower(), r.stderr[-2000:]


def test_train_as_ray_job(ray_head, pretrained_model_dir, tmp_path):
    env, url = ray_head["env"], ray_head["url"]
    wandb_key = "0123456789abcdef" * 2 + "01234567"  # a planted key: reaches the job, never printed
    out = tmp_path / "job_run"
    r = subprocess.run(
        ["bash", "launch/submit_job.sh", "configs/tiny_cpu.yaml", "--rollout.backend", "hf",
         "--rollout.num_workers", "1", "--rollout.prompts_per_step", "4", "--trainer.steps", "2",
         "--model.path", str(pretrained_model_dir), "--output_dir", str(out), "--data.eval_size", "8",
         "--eval.samples_per_prompt", "2", "--eval.pass_k", "[1]", "--checkpoint.every", "0"],
        cwd=ROOT, env=dict(env, RAY_ADDRESS=url, WANDB_API_KEY=wandb_key), capture_output=True, text=True,
        timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "succeeded" in r.stdout + r.stderr
    token = ray_head["token_file"].read_text().strip()
    assert token not in r.stdout + r.stderr and wandb_key not in r.stdout + r.stderr
    # both reached the job through its environment (the job record, read with the token)
    req = urllib.request.Request(f"{url}/api/jobs/", headers={"Authorization": f"Bearer {token}"})
    jobs = json.loads(urllib.request.urlopen(req, timeout=30).read())
    env_vars = jobs[-1]["runtime_env"]["env_vars"]
    assert env_vars["WANDB_API_KEY"] == wandb_key and env_vars["RAY_AUTH_TOKEN"] == token
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps"] == 2 and (Path(summary["adapter_dir"]) / "adapter_config.json").is_file()
