"""Heads and workers started through launch/start_head.sh / start_worker.sh as a user runs them,
stopped through launch/stop_cluster.sh, and what they listen on (for test_launch_cluster.py and
test_ray_job.py).

The environment is a user's shell: PATH with the venv's bin first, a HOME of the test's own (its
~/.ray holds the token and the pid files), nothing of Ray's or this project's process defaults
(the test process has RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 from setup_env; a user's shell has not).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from grpo_dist.util.ports import free_port

ROOT = Path(__file__).resolve().parents[1]
WORKER_PORTS = 20  # a node's worker ports: [workers, workers + WORKER_PORTS]
# a job's quick run of configs/tiny_cpu.yaml (with --model.path): one step, the hf backend, no evaluation
ONE_STEP = ["--rollout.backend", "hf", "--rollout.num_workers", "1", "--rollout.prompts_per_step", "4",
            "--rollout.group_size", "4", "--rollout.max_tokens", "5", "--trainer.steps", "1",
            "--trainer.eval_before_after", "false", "--checkpoint.every", "0", "--logging.wandb_mode", "disabled"]
_WORKER_SPANS: list[int] = []  # the worker spans and other ports given to the nodes of this process
_PORTS_GIVEN: list[int] = []
_KEEP = ("LANG", "LC_ALL", "USER", "LOGNAME", "SHELL", "TERM", "TMPDIR", "TZ",
         # the shared caches of this machine: a user's home has the compiled DeepSpeed op already
         "GRPO_DIST_CACHE", "TORCH_EXTENSIONS_DIR",
         "GRPO_DIST_EVAL_CACHE")  # off in the tests (conftest.py): every run evaluates its base model


def user_env(home: Path, **extra: str) -> dict[str, str]:
    env = {k: os.environ[k] for k in _KEEP if k in os.environ}
    env.update(PATH=f"{Path(sys.executable).parent}:/usr/local/bin:/usr/bin:/bin", HOME=str(home),
               HF_HUB_OFFLINE="1", **extra)  # tests never reach the network
    return env


@dataclass
class Node:
    role: str
    env: dict[str, str]
    pid_file: Path
    ports: dict[str, int]
    out: str = ""
    node_ip: str = "127.0.0.1"
    extra: dict = field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.ports['dashboard']}"

    @property
    def address(self) -> str:
        return f"{self.node_ip}:{self.ports['gcs']}"

    def record(self) -> dict:
        return json.loads(self.pid_file.read_text())

    def pids(self) -> dict[int, str]:
        """Every live process of this node (the pid file's session and descendants)."""
        r = subprocess.run([sys.executable, "launch/_procs.py", "list", str(self.pid_file)], cwd=ROOT,
                           capture_output=True, text=True, check=True)
        return {int(ln.split()[0]): ln.split(maxsplit=1)[1] for ln in r.stdout.splitlines()}

    def listening(self) -> list[tuple[str, int, str]]:
        """(address, port, process name) of every TCP socket listening in a process of this node."""
        return listening(set(self.pids()))


def node_ports(head: bool) -> dict[str, int]:
    """A free port for everything a node opens (Ray's fixed defaults collide with other heads on a
    shared machine), and a span of worker ports above them."""
    names = ["node_manager", "object_manager", "agent_http", "agent_grpc", "runtime_env", "metrics"]
    if head:
        names += ["gcs", "dashboard", "client", "autoscaler_metrics", "dashboard_metrics"]

    def taken(p: int) -> bool:  # by this node or by another node this process started
        return p in ports.values() or any(w <= p <= w + WORKER_PORTS for w in _WORKER_SPANS)

    ports: dict[str, int] = {}
    for n in names:  # distinct, none inside a worker span (Ray refuses a port two components share)
        ports[n] = next(p for p in iter(free_port, None) if not taken(p))
    w = next(w for w in iter(free_port, None)
             if not any(w <= p <= w + WORKER_PORTS for p in [*ports.values(), *_PORTS_GIVEN])
             and not any(abs(w - v) <= WORKER_PORTS for v in _WORKER_SPANS))
    _WORKER_SPANS.append(w)
    _PORTS_GIVEN.extend(ports.values())
    return {**ports, "workers": w}


def port_args(p: dict[str, int]) -> list[str]:
    args = ["--node-manager-port", p["node_manager"], "--object-manager-port", p["object_manager"],
            "--dashboard-agent-listen-port", p["agent_http"], "--dashboard-agent-grpc-port", p["agent_grpc"],
            "--runtime-env-agent-port", p["runtime_env"], "--metrics-export-port", p["metrics"],
            "--min-worker-port", p["workers"], "--max-worker-port", p["workers"] + WORKER_PORTS]
    if "client" in p:
        args += ["--ray-client-server-port", p["client"]]
    return [str(a) for a in args]


def start_head(home: Path, *args: str, node_ip: str | None = None, **env: str) -> Node:
    ports = node_ports(head=True)
    e = user_env(home, RAY_PORT=str(ports["gcs"]), RAY_DASHBOARD_PORT=str(ports["dashboard"]),
                 AUTOSCALER_METRIC_PORT=str(ports["autoscaler_metrics"]),
                 DASHBOARD_METRIC_PORT=str(ports["dashboard_metrics"]), **env)
    cmd = ["bash", "launch/start_head.sh", "--num-cpus", "2", *port_args(ports), *args]
    if node_ip:
        cmd += ["--node-ip-address", node_ip]
    r = subprocess.run(cmd, cwd=ROOT, env=e, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return Node("head", e, home / ".ray" / "grpo_dist" / f"head-{ports['gcs']}.json", ports, r.stdout + r.stderr,
                node_ip or "127.0.0.1")


def start_open_head(home: Path, *args: str) -> Node:
    """A head as a plain `ray start --head` starts it with Ray's defaults (KubeRay's too): no token
    authentication (RAY_AUTH_MODE unset, no token file in its HOME), here on 127.0.0.1 with free
    ports and its dashboard (job server). Its processes are recorded by launch/_procs.py, as the
    start scripts do, so :func:`stop` (launch/stop_cluster.sh) takes exactly them."""
    ports = node_ports(head=True)
    e = user_env(home, RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0",  # else Ray listens on the host's address
                 AUTOSCALER_METRIC_PORT=str(ports["autoscaler_metrics"]),
                 DASHBOARD_METRIC_PORT=str(ports["dashboard_metrics"]))
    pid_file = home / ".ray" / "grpo_dist" / f"head-{ports['gcs']}.json"
    cmd = [sys.executable, "launch/_procs.py", "start", str(pid_file), "head", "--", "ray", "start", "--head",
           "--disable-usage-stats", "--node-ip-address", "127.0.0.1", "--port", str(ports["gcs"]),
           "--dashboard-host", "127.0.0.1", "--dashboard-port", str(ports["dashboard"]), "--include-dashboard",
           "true", "--num-cpus", "2", *port_args(ports), *args]
    r = subprocess.run(cmd, cwd=ROOT, env=e, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return Node("head", e, pid_file, ports, r.stdout + r.stderr)


def start_worker(home: Path, head: Node, node_ip: str, *args: str) -> Node:
    ports = node_ports(head=False)
    e = user_env(home, RAY_NODE_IP=node_ip, RAY_AUTH_TOKEN_PATH=head.env.get("RAY_AUTH_TOKEN_PATH",
                                                                           str(Path(head.env["HOME"]) / ".ray/auth_token")))
    r = subprocess.run(["bash", "launch/start_worker.sh", head.address, "--num-cpus", "1", *port_args(ports), *args],
                       cwd=ROOT, env=e, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    name = "worker-" + head.address.replace(":", "-") + ".json"
    return Node("worker", e, home / ".ray" / "grpo_dist" / name, ports, r.stdout + r.stderr, node_ip)


def stop(node: Node, *which: str, timeout: float = 120) -> tuple[subprocess.CompletedProcess, float]:
    t0 = time.monotonic()
    r = subprocess.run(["bash", "launch/stop_cluster.sh", *(which or (str(node.pid_file),))], cwd=ROOT,
                       env=node.env, capture_output=True, text=True, timeout=timeout)
    return r, time.monotonic() - t0


def listening(pids: set[int]) -> list[tuple[str, int, str]]:
    """(address, port, process name) of every TCP socket listening in one of ``pids`` (ss -ltnp)."""
    out = []
    for ln in subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True, check=True).stdout.splitlines():
        local = ln.split()[3]
        for name, pid in re.findall(r'\("([^"]+)",pid=(\d+)', ln):
            if int(pid) in pids:
                host, port = local.rsplit(":", 1)
                out.append((host.strip("[]"), int(port), name))
    return sorted(set(out))


def descendants(root: int) -> set[int]:
    """``root`` and every process below it."""
    kids: dict[int, list[int]] = {}
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                stat = (p / "stat").read_text()
            except OSError:
                continue
            kids.setdefault(int(stat[stat.rindex(")") + 2:].split()[1]), []).append(int(p.name))
    out, todo = set(), [root]
    while todo:
        p = todo.pop()
        out.add(p)
        todo += kids.get(p, [])
    return out


def listening_unix(pids: set[int]) -> list[tuple[str, str]]:
    """(path, process name) of every Unix socket listening in one of ``pids`` (ss -lxp); an abstract
    socket's name starts with "@"."""
    out = []
    for ln in subprocess.run(["ss", "-lxpH"], capture_output=True, text=True, check=True).stdout.splitlines():
        local = ln.split()[4]
        for name, pid in re.findall(r'\("([^"]+)",pid=(\d+)', ln):
            if int(pid) in pids:
                out.append((local, name))
    return sorted(set(out))


def only_owner_connects(path: str) -> bool:
    """Whether only this user (and root) can connect to the Unix socket at ``path``: connecting
    needs write permission on the socket and search permission on every directory above it."""
    st = os.stat(path)
    if st.st_mode & 0o022 == 0:
        return True
    parent = Path(path).parent
    while parent != parent.parent:
        d = parent.stat()
        if d.st_uid == os.getuid() and d.st_mode & 0o011 == 0:
            return True
        parent = parent.parent
    return False


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] not in "ZX"


def documented_submit() -> tuple[str, list[str]]:
    """docs/multinode.md "Any Ray cluster": its `ray job submit` command line as written, and its
    `export` lines."""
    doc = (ROOT / "docs" / "multinode.md").read_text()
    m = re.search(r"\n## Any Ray cluster\n(.*?)(?=\n## )", doc, re.S)
    assert m, "docs/multinode.md has no '## Any Ray cluster' section"
    lines = "\n".join(re.findall(r"```bash\n(.*?)```", m.group(1), re.S)).splitlines()
    submit = [ln for ln in lines if ln.startswith("ray job submit ")]
    assert len(submit) == 1, lines
    return submit[0], [ln for ln in lines if ln.startswith("export ")]


def job_record(url: str, job_id: str, token: str | None = None) -> dict:
    """The job server's record of ``job_id`` (its runtime_env included)."""
    import urllib.request

    headers = {"Authorization": f"Bearer {token}"} if token else {}
    req = urllib.request.Request(f"{url}/api/jobs/{job_id}", headers=headers)
    return json.loads(urllib.request.urlopen(req, timeout=30).read())
