"""free_port: a port nobody else is about to be handed.

A CI run failed when the port the multinode test had picked for Ray's dashboard (bind to port 0,
read it, close) was handed again by the kernel to Ray's GCS a moment later: both asked for "any
free port" from the same ephemeral range. free_port now draws from outside that range (and
outside Ray's worker ports), where port-0 binds never land.
"""

from __future__ import annotations

import socket

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
