"""Ports for rendezvous and for the Ray nodes the tests start (no Ray import: the GPU checks use
it on machines without Ray)."""

from __future__ import annotations

import random
import socket


RAY_WORKER_PORTS = (10002, 19999)  # Ray's default min_worker_port .. max_worker_port


def ephemeral_range() -> tuple[int, int]:
    """The ports the kernel hands out for port-0 binds and outgoing connections."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            lo, hi = (int(x) for x in f.read().split())
        return lo, hi
    except (OSError, ValueError):
        return 32768, 60999  # Linux's default


def _draw_port(lo: int, hi: int) -> int:
    return random.SystemRandom().randint(lo, hi)


def free_port(host: str = "127.0.0.1") -> int:
    """A port that is free on ``host`` now (of this node: call it where the port will be used).

    Drawn at random from outside the kernel's ephemeral range and Ray's worker ports: a port read
    from a port-0 bind is the kind the kernel hands out again to the next program asking for any
    free port (a CI run lost its Ray dashboard's port to Ray's own GCS that way). Falls back to a
    port-0 bind where no such span is left."""
    lo, hi = ephemeral_range()
    first = RAY_WORKER_PORTS[1] + 1
    spans = [(a, b) for a, b in ((first, lo - 1), (max(first, hi + 1), 65535)) if b - a >= 100]
    if spans:
        a, b = max(spans, key=lambda s: s[1] - s[0])
        for _ in range(100):
            port = _draw_port(a, b)
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                try:
                    s.bind((host, port))
                except OSError:
                    continue
                return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]
