"""The local cluster's door: the cluster a run starts (init_ray without an address) has token
authentication on, with a token of its own that no file holds. A client without the token (no
token sent, or another one) is refused by the running cluster; one with it gets in."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

DRIVER = """
    import json, os, sys
    import ray
    from grpo_dist.config import load_config
    from grpo_dist.cluster.ray_utils import init_ray, shutdown_ray
    init_ray(load_config(None, {"cluster": {"num_cpus": 2}}))
    ctx = ray.get_runtime_context()
    node = ray._private.worker._global_node

    @ray.remote
    def inner():
        return 7

    @ray.remote
    class Worker:  # what an actor's code (a reward, an agent, a tool) starts, and Ray still working after
        def check(self):
            import subprocess
            child = subprocess.run([sys.executable, "-c", "import os; print('RAY_AUTH_TOKEN' in os.environ)"],
                                   capture_output=True, text=True).stdout.strip()
            other = Worker.remote()
            return {"child_has_token": child, "own_env": "RAY_AUTH_TOKEN" in os.environ,
                    "task": ray.get(inner.remote()), "actor": ray.get(other.ping.remote())}

        def ping(self):
            return "pong"

    worker = ray.get(Worker.remote().check.remote())
    print(json.dumps({"gcs": ctx.gcs_address, "token": os.environ.get("RAY_AUTH_TOKEN"), "worker": worker,
                      "mode": os.environ.get("RAY_AUTH_MODE"), "session": node.get_session_dir_path(),
                      "runtime_env": ctx.runtime_env.get("env_vars", {})}), flush=True)
    sys.stdin.readline()  # the clients are done
    shutdown_ray()
    print(json.dumps({k: os.environ.get(k) for k in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN")}), flush=True)
"""

CLIENT = """
import sys
import ray
try:
    ray.init(address=sys.argv[1], log_to_driver=False)
    print("IN", ray.get(ray.remote(lambda: 6 * 7).remote(), timeout=120))
except Exception as e:
    print("REFUSED", type(e).__name__)
"""


def _client(gcs: str, home: Path, auth: dict[str, str]) -> tuple[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH")}
    r = subprocess.run([sys.executable, "-c", CLIENT, gcs], env={**env, "HOME": str(home), **auth},
                       capture_output=True, text=True, timeout=180)
    return r.stdout.strip(), r.stderr


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_the_local_cluster_refuses_a_client_without_its_token(tmp_path):
    home, client_home = tmp_path / "home", tmp_path / "client-home"
    home.mkdir()
    client_home.mkdir()
    # the driver as `grpo-dist train` has it (RAY_AUTH_MODE=disabled from setup_env), its own HOME to look into
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH")}
    drv = subprocess.Popen([sys.executable, "-c", textwrap.dedent(DRIVER)], stdin=subprocess.PIPE,
                           stdout=subprocess.PIPE, text=True, cwd=tmp_path, env={**env, "HOME": str(home)},
                           start_new_session=True)
    try:
        info = json.loads(drv.stdout.readline())
        token = info["token"]
        assert info["mode"] == "token" and token and len(token) == 64
        # the session (its raylet and object store sockets, its logs) lies in a directory of this user's only
        temp = Path(info["session"]).parent.parent  # Ray's temp dir (0777, Ray's doing) in a private one
        assert temp.name.startswith("grpo-ray-") and (temp.stat().st_mode & 0o777) == 0o700, info["session"]
        # a worker drops the token once connected: its children do not inherit it, and it still reaches Ray
        assert info["worker"] == {"child_has_token": "False", "own_env": False, "task": 7, "actor": "pong"}
        assert info["runtime_env"].get("RAY_AUTH_MODE") == "token" and "RAY_AUTH_TOKEN" not in info["runtime_env"]
        with ThreadPoolExecutor(3) as pool:  # a refusal takes Ray's ~20 s of retries: the three at once
            none, wrong, right = pool.map(lambda auth: _client(info["gcs"], client_home, auth), [
                {"RAY_AUTH_MODE": "disabled"},  # sends no token
                {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": "0" * 64},  # another token
                {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token}])
        for out, err in (none, wrong):
            assert out.startswith("REFUSED") and "Unauthenticated" in err, (out, err[-2000:])
        assert right[0].endswith("IN 42"), right
        drv.stdin.write("done\n")
        drv.stdin.flush()
        after = json.loads(drv.stdout.readline())
        assert drv.wait(timeout=120) == 0
    finally:
        if drv.poll() is None:
            drv.kill()
    assert after == {"RAY_AUTH_MODE": "disabled", "RAY_AUTH_TOKEN": None}  # the environment as before
    # no file holds the token: not ~/.ray (the driver's and the clients'), not the session's directory
    assert not (home / ".ray").exists() and not (client_home / ".ray").exists()
    leaks = []
    for f in Path(info["session"]).rglob("*"):
        try:
            if f.is_file() and not f.is_symlink() and token.encode() in f.read_bytes():
                leaks.append(str(f))
        except OSError:
            pass
    assert leaks == []
