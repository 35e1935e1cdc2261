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


def is_loopback(host: str) -> bool:
    return host in ("localhost", "::1") or host.startswith("127.")


def loopback_interface() -> str:
    """The loopback interface's name ("lo" on Linux)."""
    names = [n for _, n in socket.if_nameindex()]
    return next((n for n in names if n == "lo" or n.startswith("lo")), "lo")


def tcp_store(host: str, port: int, world_size: int, is_master: bool, timeout):
    """torch's ``TCPStore``; the server (``is_master``) listens on ``host`` only. torch's own
    server listens on every interface, so a rendezvous on 127.0.0.1 opened a port to the network:
    here it serves from a socket bound to ``host`` (``master_listen_fd``, whose descriptor the
    store takes over)."""
    import torch.distributed as dist

    if not is_master:
        return dist.TCPStore(host, int(port), world_size, False, timeout=timeout)
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, int(port)))
        sock.listen(1024)
    except OSError:
        sock.close()
        raise
    return dist.TCPStore(host, int(port), world_size, True, timeout=timeout, master_listen_fd=sock.detach())


def gloo_on_loopback(master_addr: str) -> None:
    """All ranks meet on a loopback address (one machine): gloo's pairs listen on the loopback
    interface too, not on the address the hostname resolves to (``GLOO_SOCKET_IFNAME``, unless set)."""
    import os

    if is_loopback(master_addr) and not os.environ.get("GLOO_SOCKET_IFNAME"):
        os.environ["GLOO_SOCKET_IFNAME"] = loopback_interface()
