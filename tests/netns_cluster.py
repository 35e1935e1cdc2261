"""A Ray cluster on netns hosts (tests/netns_hosts.py), started as on real machines: the head with
launch/start_head.sh on host 1, workers with launch/start_worker.sh on the others, token
authentication, the token file copied to each host's HOME (as `scp -p` would), jobs through
launch/submit_job.sh from outside the hosts (the operator's address on the bridge).

Every host has its own port space, so Ray's default ports are used. Node resources: each host i
holds {hosti: 1} plus what the test asks for. The job server listens on host 1's address
(RAY_DASHBOARD_HOST; on real machines an SSH tunnel to 127.0.0.1 is the recommended way).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from netns_hosts import ROOT, Hosts

CACHE = os.environ.get("GRPO_DIST_CACHE") or str(Path.home() / ".cache" / "grpo_dist")
# RAY_agent_register_timeout_ms: a raylet waits this long for its dashboard agent's port file (on a
# loaded machine the agent's start takes longer than the default and the raylet exits)
NODE_ENV = {"HF_HUB_OFFLINE": "1", "GRPO_DIST_CACHE": CACHE, "RAY_DISABLE_DOCKER_CPU_WARNING": "1",
            "RAY_agent_register_timeout_ms": "300000"}


@dataclass
class NetCluster:
    hosts: Hosts
    token: Path  # the operator's copy
    out: dict[int, str] = field(default_factory=dict)

    @property
    def head(self) -> str:
        return f"{self.hosts.addr(1)}:6379"

    @property
    def dashboard(self) -> str:
        return f"http://{self.hosts.addr(1)}:8265"

    def on(self, i: int, *cmd: str, timeout: float = 300, **env: str) -> subprocess.CompletedProcess:
        return self.hosts.run(i, *cmd, timeout=timeout, **NODE_ENV, **env)

    def driver(self, i: int, code: str, timeout: float = 600) -> subprocess.CompletedProcess:
        """A Python driver on host i joining the cluster at the head's address."""
        return self.on(i, "python3", "-c", code, timeout=timeout, RAY_AUTH_MODE="token", RAY_ADDRESS=self.head)

    def submit(self, cwd: Path, *args: str, timeout: float = 1500) -> subprocess.CompletedProcess:
        """launch/submit_job.sh from the operator's machine (outside every host)."""
        from netns_hosts import env

        e = env(**NODE_ENV, RAY_ADDRESS=self.dashboard, RAY_AUTH_TOKEN_PATH=str(self.token), HOME=str(cwd))
        e.pop("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", None)
        return subprocess.run(["bash", str(ROOT / "launch/submit_job.sh"), *args], cwd=cwd, env=e,
                              capture_output=True, text=True, timeout=timeout)

    def stop(self) -> None:
        for i in range(self.hosts.n, 0, -1):
            self.on(i, "bash", str(ROOT / "launch/stop_cluster.sh"), timeout=120)


def start_cluster(hosts: Hosts, resources: dict[int, dict], cpus: dict[int, int], op_dir: Path,
                  started: int | None = None) -> NetCluster:
    """Head on host 1, a worker on every other host up to ``started`` (default: all; the others
    join later with ``start_worker``, as an autoscaler's new nodes); returns once they have joined."""
    def res(i: int) -> str:
        return json.dumps({f"host{i}": 1, **resources.get(i, {})})

    c = NetCluster(hosts, op_dir / "auth_token")
    r = hosts.run(1, "bash", str(ROOT / "launch/start_head.sh"), "--node-ip-address", hosts.addr(1),
                  "--num-cpus", str(cpus.get(1, 1)), "--resources", res(1), "--object-store-memory", str(200 * 1024 * 1024), timeout=300,
                  RAY_DASHBOARD_HOST=hosts.addr(1), **NODE_ENV)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    c.out[1] = r.stdout + r.stderr
    token = hosts.home(1) / ".ray" / "auth_token"
    for dst in [hosts.home(i) / ".ray" / "auth_token" for i in range(2, hosts.n + 1)] + [c.token]:
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(token, dst)  # scp -p: mode 600 travels
    for i in range(2, (started or hosts.n) + 1):
        c.out[i] = start_worker(c, i, res(i), cpus.get(i, 1))
    return c


def start_worker(c: NetCluster, i: int, resources: str, cpus: int, tries: int = 3, **env: str) -> str:
    """launch/start_worker.sh on host i. `ray start` gives a new node a fixed 30 s to register with
    the GCS; on a loaded machine that can pass: the host's processes are killed (only that host's)
    and the start is tried again, at most ``tries`` times."""
    for attempt in range(tries):
        r = c.hosts.run(i, "bash", str(ROOT / "launch/start_worker.sh"), c.head, "--num-cpus", str(cpus),
                        "--resources", resources, "--object-store-memory", str(200 * 1024 * 1024), timeout=300,
                        RAY_NODE_IP=c.hosts.addr(i), **NODE_ENV, **env)
        if r.returncode == 0:
            return r.stdout + r.stderr
        print(f"host {i}: start_worker.sh failed (try {attempt + 1}): {r.stderr.strip().splitlines()[-1:]}")
        c.hosts.script("kill", str(i))
    raise AssertionError(r.stdout[-3000:] + r.stderr[-3000:])


WHERE = """
import json, os, socket, ray
ray.init()
@ray.remote(num_cpus=0)
def where():
    return {"node_ip": ray.util.get_node_ip_address(), "tmp": sorted(os.listdir("/tmp")), "home": os.environ["HOME"],
            "session": os.path.realpath("/tmp/ray/session_latest")}
hosts = [k for n in ray.nodes() if n["Alive"] for k in n["Resources"] if k.startswith("host")]
print("WHERE " + json.dumps(dict(zip(hosts, ray.get([where.options(resources={h: 0.01}).remote() for h in hosts])))))
"""
