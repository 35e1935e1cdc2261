"""free_port: a port nobody else is about to be handed.

A CI run failed when the port the multinode test had picked for Ray's dashboard (bind to port 0,
read it, close) was handed again by the kernel to Ray's GCS a moment later: both asked for "any
free port" from the same ephemeral range. free_port now draws from outside that range (and
outside Ray's worker ports), where port-0 binds never land.
"""

from __future__ import annotations

import socket

import pytest

from grpo_dist.util import ports as port_mod
from grpo_dist.util.ports import free_port


def test_ports_come_from_outside_the_ephemeral_range_and_rays_worker_ports():
    lo, hi = port_mod.ephemeral_range()
    ports = [free_port() for _ in range(50)]
    assert all(not lo <= p <= hi for p in ports), (lo, hi, ports)
    assert all(not port_mod.RAY_WORKER_PORTS[0] <= p <= port_mod.RAY_WORKER_PORTS[1] for p in ports)
    assert len(set(ports)) > 40  # drawn at random, not the same port each time
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", ports[0]))  # and free


def test_a_port_in_use_is_skipped(monkeypatch):
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        busy = free_port()
        taken.bind(("127.0.0.1", busy))
        other = free_port()
        draws = iter([busy, busy, other])
        monkeypatch.setattr(port_mod, "_draw_port", lambda lo, hi: next(draws))
        assert free_port() == other


def test_without_room_outside_the_ephemeral_range_it_asks_the_kernel(monkeypatch):
    """No span of 100 ports is left outside the (pretended) ephemeral range: nothing is drawn, the
    port comes from a port-0 bind, so it lies in the kernel's real ephemeral range, and is free."""
    lo, hi = port_mod.ephemeral_range()

    def no_draw(a, b):
        raise AssertionError(f"drew from {a}-{b} although no span was left")

    monkeypatch.setattr(port_mod, "ephemeral_range", lambda: (1024, 65535))
    monkeypatch.setattr(port_mod, "_draw_port", no_draw)
    ports = {free_port() for _ in range(5)}
    assert all(lo <= p <= hi for p in ports), (lo, hi, ports)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", ports.pop()))


@pytest.mark.slow
def test_a_learner_group_on_loopback_listens_on_loopback_only():
    """The learner's process group (dist_init, DeepSpeed adopting it): torch's env:// store listened
    on every interface, so a one-machine run opened a port to the network."""
    import subprocess
    import sys

    code = ("import os, subprocess\n"
            "from grpo_dist.util.ports import free_port\n"
            "os.environ.update(RANK='0', WORLD_SIZE='1', LOCAL_RANK='0', MASTER_ADDR='127.0.0.1',"
            " MASTER_PORT=str(free_port()))\n"
            "from grpo_dist.learner.dist_init import init_process_group\n"
            "init_process_group('gloo')\n"
            "import deepspeed.comm as dc, torch\n"
            "t = torch.ones(2); dc.all_reduce(t); print(t.tolist())\n"
            "ss = subprocess.run(['ss', '-ltnpH'], capture_output=True, text=True).stdout\n"
            "print(sorted({l.split()[3].rsplit(':', 1)[0] for l in ss.splitlines() if f'pid={os.getpid()},' in l}))\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.splitlines()[-2:] == ["[1.0, 1.0]", "['127.0.0.1']"], r.stdout
