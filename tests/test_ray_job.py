"""A training run submitted as a Ray job to a separately started head (`launch/` scripts).

The head is started by this test with `ray start --head --block` in its own process group and
stopped by that handle only. The HF rollout backend keeps it quick: vLLM on the real stack is
covered by test_e2e.py; this test is about the job path (working_dir shipping, cluster.address
auto, the driver joining an existing cluster).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from grpo_dist.cluster.ray_utils import free_port

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture()
def ray_head(tmp_path):
    venv_bin = str(Path(sys.executable).parent)
    env = dict(os.environ, PATH=f"{venv_bin}:{os.environ.get('PATH', '')}", RAY_AUTH_MODE="disabled",
               RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0")
    port, dash = free_port(), free_port()
    log = open(tmp_path / "head.log", "w")
    proc = subprocess.Popen(
        ["ray", "start", "--head", "--port", str(port), "--num-cpus", "2", "--dashboard-host", "127.0.0.1",
         "--dashboard-port", str(dash), "--include-dashboard", "true", "--block"],
        env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, cwd=ROOT)
    url = f"http://127.0.0.1:{dash}"
    deadline = time.time() + 120
    while time.time() < deadline:
        try:
            urllib.request.urlopen(f"{url}/api/version", timeout=2)
            break
        except Exception:
            if proc.poll() is not None:
                pytest.fail(f"ray head exited: {(tmp_path / 'head.log').read_text()[-2000:]}")
            time.sleep(1)
    else:
        pytest.fail("ray head's job server did not come up in 120 s")
    yield env, url
    os.killpg(proc.pid, signal.SIGTERM)  # the head we started, and only it
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)


def test_train_as_ray_job(ray_head, pretrained_model_dir, tmp_path):
    env, url = ray_head
    out = tmp_path / "job_run"
    r = subprocess.run(
        ["bash", "launch/submit_job.sh", "configs/tiny_cpu.yaml", "--rollout.backend", "hf",
         "--rollout.num_workers", "1", "--rollout.prompts_per_step", "4", "--trainer.steps", "2",
         "--model.path", str(pretrained_model_dir), "--output_dir", str(out), "--data.eval_size", "8",
         "--eval.samples_per_prompt", "2", "--eval.pass_k", "[1]", "--checkpoint.every", "0"],
        cwd=ROOT, env=dict(env, RAY_ADDRESS=url), capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "succeeded" in r.stdout + r.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps"] == 2 and (Path(summary["adapter_dir"]) / "adapter_config.json").is_file()
