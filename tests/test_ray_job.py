"""A training run submitted as a Ray job to a separately started head (`launch/` scripts).

The head is started by `launch/start_head.sh` as a user starts it (token authentication on, a
token file of the test's own) and stopped by `launch/stop_cluster.sh`. The HF rollout backend keeps it quick: vLLM on the real stack is
covered by test_e2e.py; this test is about the job path (working_dir shipping, cluster.address
auto, the driver joining an existing cluster).
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from cluster_scripts import ONE_STEP, ROOT, documented_submit, job_record, start_head, stop

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def ray_head(tmp_path_factory):
    """A head started by launch/start_head.sh as docs/security.md says (token authentication on, on
    127.0.0.1, in a user's environment: tests/cluster_scripts.py), with a token file of its own
    (never ~/.ray/auth_token: other Ray users of this machine); stopped by launch/stop_cluster.sh."""
    tmp_path = tmp_path_factory.mktemp("head")
    token_file = tmp_path / "secret" / "auth_token"
    head = start_head(tmp_path / "home", "--include-dashboard", "true", RAY_AUTH_TOKEN_PATH=str(token_file))
    url = head.url
    deadline = time.time() + 120
    while time.time() < deadline:
        try:
            urllib.request.urlopen(f"{url}/api/version", timeout=2)
            pytest.fail("the job server answered a request without the token")
        except urllib.error.HTTPError as e:  # up, and refusing: 401 without a token
            assert e.code == 401, e
            break
        except OSError:
            time.sleep(1)
    else:
        pytest.fail("ray head's job server did not come up in 120 s")
    yield {"env": dict(head.env), "url": url, "token_file": token_file, "out": head.out, "head": head,
           "port": head.ports["gcs"], "dash": head.ports["dashboard"]}
    r, _ = stop(head)  # the head we started, and only it
    assert r.returncode == 0, r.stdout + r.stderr


def test_head_is_secure_by_default(ray_head):
    """Token made private and never printed; every port on the given address; no token, no job."""
    token_file, env = ray_head["token_file"], ray_head["env"]
    token = token_file.read_text().strip()
    assert len(token) == 64 and oct(token_file.stat().st_mode & 0o777) == "0o600"
    log = ray_head["out"]
    assert token not in log and f"token from {token_file}" in log and "launch/start_worker.sh 127.0.0.1:" in log
    listening = ray_head["head"].listening()  # every process of the head (test_launch_cluster.py: in detail)
    names = {n for _, _, n in listening}
    assert {"gcs_server", "raylet"} <= names, listening
    hosts = {host for host, _, _ in listening}
    assert hosts <= {"127.0.0.1", "::ffff:127.0.0.1"}, listening  # not 0.0.0.0 / *, not the public IP
    assert ("127.0.0.1", ray_head["dash"]) in {(h, p) for h, p, _ in listening}
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
                       capture_output=True, text=True, timeout=120,
                       env=dict(no_token, RAY_AUTH_MODE="token", RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0"))
    assert r.returncode != 0 and "token" in r.stderr.lower(), r.stderr[-2000:]


REWARD = """import json, os

def length_bonus(prompts, completions, **kw):
    with open({listing!r}, "w") as f:  # what the job's working dir holds, seen from the reward actor
        json.dump(sorted(os.listdir(".")), f)
    return [min(len(c), 4) / 4 for c in completions]
"""


def test_train_as_ray_job(ray_head, pretrained_model_dir, tmp_path):
    """From a user's own directory: a relative model.path (read there, not regenerated in Ray's
    copy), a plug-in reward file (shipped), logs and a token file beside them (not shipped)."""
    env, url = ray_head["env"], ray_head["url"]
    wandb_key = "0123456789abcdef" * 2 + "01234567"  # a planted key: reaches the job, never printed
    proj = tmp_path / "proj"
    (proj / "models").mkdir(parents=True)
    (proj / "models" / "base").symlink_to(pretrained_model_dir)
    (proj / "my.yaml").write_text((ROOT / "configs" / "tiny_cpu.yaml").read_text())
    listing = tmp_path / "working_dir.json"
    (proj / "my_reward.py").write_text(REWARD.format(listing=str(listing)))
    (proj / "train.log").write_text("a log that must stay here\n")
    (proj / "auth_token").write_text("f" * 64)
    (proj / "runs").mkdir()
    r = subprocess.run(
        ["bash", str(ROOT / "launch" / "submit_job.sh"), "my.yaml", "--rollout.backend", "hf",
         "--rollout.num_workers", "1", "--rollout.prompts_per_step", "4", "--trainer.steps", "2",
         "--model.path", "models/base", "--output_dir", "runs/job", "--data.eval_size", "8",
         "--reward.functions", '[{fn: correctness}, {fn: "my_reward.py:length_bonus", weight: 0.1}]',
         "--eval.samples_per_prompt", "2", "--eval.pass_k", "[1]", "--checkpoint.every", "0"],
        cwd=proj, env=dict(env, RAY_ADDRESS=url, WANDB_API_KEY=wandb_key), capture_output=True, text=True,
        timeout=600)
    out = r.stdout + r.stderr
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "succeeded" in out
    token = ray_head["token_file"].read_text().strip()
    assert token not in out and wandb_key not in out
    # what travelled: printed, and seen from inside the job; nothing else of proj
    upload = out[out.index("uploading to the job"):out.index("in all")]
    assert "grpo_dist/" in upload and "my.yaml" in upload and "my_reward.py" in upload, upload
    assert "train.log" not in upload and "auth_token" not in upload and "models" not in upload, upload
    assert set(json.loads(listing.read_text())) - {"__pycache__"} == {"grpo_dist", "my.yaml", "my_reward.py"}
    # the model was read where it is, once (tiny_cpu.yaml's make_if_missing would regenerate a missing one)
    run_dir = proj / "runs" / "job"
    resolved = (run_dir / "config.yaml").read_text()
    assert f"path: {proj / 'models' / 'base'}" in resolved, resolved[:800]
    assert "generating a local" not in out
    # both secrets reached the job through its environment (the job record, read with the token)
    req = urllib.request.Request(f"{url}/api/jobs/", headers={"Authorization": f"Bearer {token}"})
    jobs = json.loads(urllib.request.urlopen(req, timeout=30).read())
    env_vars = jobs[-1]["runtime_env"]["env_vars"]
    assert env_vars["WANDB_API_KEY"] == wandb_key and env_vars["RAY_AUTH_TOKEN"] == token
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["steps"] == 2 and (Path(summary["adapter_dir"]) / "adapter_config.json").is_file()
    assert "reward/length_bonus" in summary["final_metrics"]
    # following the job as docs/security.md says: the token and RAY_AUTH_MODE=token (without it Ray's CLI fails)
    job_id = re.search(r"Job '([^']+)' submitted successfully", out).group(1)
    follow = dict(env, RAY_ADDRESS=url)
    for cmd in (["status", job_id], ["logs", job_id]):
        r = subprocess.run(["ray", "job", *cmd], env=dict(follow, RAY_AUTH_MODE="token"), capture_output=True,
                           text=True, timeout=120)
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
        want = "succeeded" if cmd[0] == "status" else "=== grpo-dist summary ==="
        assert want in (r.stdout + r.stderr).lower() if cmd[0] == "status" else want in r.stdout, \
            r.stdout[-2000:] + r.stderr[-2000:]
        r = subprocess.run(["ray", "job", *cmd], env=follow, capture_output=True, text=True, timeout=120)
        assert r.returncode != 0, r.stdout[-2000:]


def test_the_documented_ray_job_submit_command_trains(ray_head, pretrained_model_dir, tmp_path):
    """docs/multinode.md "Any Ray cluster": Ray's own `ray job submit`, as written there, from a
    directory holding only the config: the code is the nodes' installed grpo_dist, the token is in
    the submitter's environment only (the driver joins with its node's), a relative output_dir
    lands in the submitter's directory."""
    cmd, exports = documented_submit()
    assert any("RAY_AUTH_MODE=token" in e and "RAY_AUTH_TOKEN_PATH=" in e for e in exports), exports
    proj = tmp_path / "my_run"
    proj.mkdir()
    (proj / "my.yaml").write_text((ROOT / "configs" / "tiny_cpu.yaml").read_text())
    token_file, url = ray_head["token_file"], ray_head["url"]
    env = dict(ray_head["env"], RAY_ADDRESS=url, RAY_AUTH_MODE="token", RAY_AUTH_TOKEN_PATH=str(token_file))
    r = subprocess.run(["bash", "-c", cmd + " " + shlex.join([*ONE_STEP, "--model.path", str(pretrained_model_dir)])],
                       cwd=proj, env=env, capture_output=True, text=True, timeout=600)
    out = r.stdout + r.stderr
    assert r.returncode == 0 and "succeeded" in out, r.stdout[-3000:] + r.stderr[-3000:]
    token = token_file.read_text().strip()
    assert token not in out
    summary = json.loads((proj / "runs" / "tiny_cpu" / "summary.json").read_text())
    assert summary["steps"] == 1
    job_id = re.search(r"Job '([^']+)' submitted successfully", out).group(1)
    assert job_record(url, job_id, token)["runtime_env"]["env_vars"] == {"GRPO_DIST_SUBMIT_DIR": str(proj)}
