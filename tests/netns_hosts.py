"""Hosts in network namespaces (launch/netns_hosts.sh) for the multi-host tests: one subnet, one
state directory and one name prefix of the tests' own (not the script's defaults, which a demo may
hold), made by `up` and removed by `down` in the fixture's teardown.

Skipped, with one printed reason, where namespaces cannot be made (not root, no `ip`, no unshare,
no CAP_SYS_ADMIN / CAP_NET_ADMIN).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "launch" / "netns_hosts.sh"
TEST_ENV = {"GD_HOSTS_PREFIX": "gt", "GD_HOSTS_NET": "10.213.78", "GD_HOSTS_STATE": "/run/grpo_dist_test_hosts"}


def env(**extra: str) -> dict[str, str]:
    """A user's shell (cluster_scripts.user_env: none of the test process's Ray settings), `ip` on PATH."""
    from cluster_scripts import user_env

    e = user_env(Path("/nonexistent"))  # each host's HOME is set by the script
    e["PATH"] += ":/usr/sbin:/sbin"
    e.update(TEST_ENV, **extra)
    return e


def why_not() -> str | None:
    """None where namespaces, a bridge and a mount namespace can be made; else the reason."""
    if os.geteuid() != 0:
        return "netns hosts need root (ip netns, bridges, bind mounts)"
    for tool in ("ip", "unshare"):
        if shutil.which(tool) is None:
            return f"netns hosts need `{tool}`"
    probe = "gtprobe"
    r = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if r.returncode != 0:
        return f"cannot make a network namespace: {r.stderr.strip()}"
    try:
        r = subprocess.run(["ip", "netns", "exec", probe, "unshare", "--mount", "--propagation", "private", "true"],
                           capture_output=True, text=True)
        if r.returncode != 0:
            return f"cannot make a mount namespace: {r.stderr.strip()}"
    finally:
        subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


@dataclass
class Hosts:
    n: int
    state: Path = Path(TEST_ENV["GD_HOSTS_STATE"])

    def addr(self, i: int) -> str:
        return f"{TEST_ENV['GD_HOSTS_NET']}.{10 + i}"

    @property
    def shared(self) -> Path:
        return self.state / "shared"

    def home(self, i: int) -> Path:
        return self.state / f"h{i}" / "home"

    def script(self, *args: str, timeout: float = 60, **extra: str) -> subprocess.CompletedProcess:
        return subprocess.run(["bash", str(SCRIPT), *args], env=env(**extra), capture_output=True, text=True,
                              timeout=timeout)

    def run(self, i: int, *cmd: str, timeout: float = 60, **extra: str) -> subprocess.CompletedProcess:
        return self.script("exec", str(i), *cmd, timeout=timeout, **extra)

    def popen(self, i: int, *cmd: str, **kw) -> subprocess.Popen:
        extra = kw.pop("env", {})
        return subprocess.Popen(["bash", str(SCRIPT), "exec", str(i), *cmd], env=env(**extra), **kw)


def hosts_fixture(n: int):
    reason = why_not()
    if reason:
        print(f"skipped: {reason}")
        pytest.skip(reason)
    h = Hosts(n)
    h.script("down")  # what an interrupted earlier run left
    r = h.script("up", str(n))
    assert r.returncode == 0, r.stdout + r.stderr
    try:
        yield h
    finally:
        r = h.script("down", timeout=120)
        assert r.returncode == 0, r.stdout + r.stderr
