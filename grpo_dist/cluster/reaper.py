"""A local Ray cluster does not outlive its driver.

``ray.init(address="local")`` starts GCS, raylet, dashboard and agents as the driver's
descendants. GCS, raylet and the workers die with the driver, but a driver killed with SIGKILL
leaves Ray's dashboard and runtime-env agents running for minutes. After the local cluster has
started, the driver spawns this module as a small process of its own session: it records the
driver's descendants (pid and start time, so a reused pid is never touched), waits for the driver
to end, and then stops exactly those processes (SIGTERM, then SIGKILL after a grace period). A
driver that shuts Ray down normally leaves nothing for it to do. Linux only (reads /proc).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

Proc = tuple[int, int]  # (pid, start time in clock ticks since boot)


def _stat(pid: int) -> tuple[int, int] | None:
    """(parent pid, start time) of ``pid``, None if it is gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = raw[raw.rindex(")") + 2:].split()  # after "pid (comm) "
    return int(fields[1]), int(fields[19])


def descendants(root: int) -> list[Proc]:
    """Every process below ``root`` now, with its start time."""
    children: dict[int, list[int]] = {}
    starts: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            st = _stat(int(entry.name))
            if st is not None:
                children.setdefault(st[0], []).append(int(entry.name))
                starts[int(entry.name)] = st[1]
    out, todo = [], list(children.get(root, []))
    while todo:
        pid = todo.pop()
        out.append((pid, starts[pid]))
        todo.extend(children.get(pid, []))
    return out


def _is_ray(pid: int) -> bool:
    try:
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return False
    return "/ray/" in cmd or cmd.startswith("ray::")


def ray_processes(driver: int) -> list[Proc]:
    """The driver's descendants that belong to its local Ray cluster (and everything below them)."""
    below = descendants(driver)
    roots = [p for p in below if _is_ray(p[0])]
    out = set(roots)
    for pid, _ in roots:
        out.update(descendants(pid))
    return sorted(out)


def _alive(proc: Proc) -> bool:
    st = _stat(proc[0])
    return st is not None and st[1] == proc[1]


def start_reaper() -> subprocess.Popen | None:
    """Call in the driver right after it started a local cluster."""
    if not Path("/proc/self/stat").exists():
        return None
    me = os.getpid()
    st = _stat(me)
    procs = ray_processes(me)
    if st is None or not procs:
        return None
    return subprocess.Popen([sys.executable, "-m", "grpo_dist.cluster.reaper", json.dumps([me, st[1]]),
                             json.dumps(procs)], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True, close_fds=True)


def reap(driver: Proc, procs: list[Proc], poll_s: float = 0.5, grace_s: float = 5.0) -> int:
    """Wait for ``driver`` to end, then stop what is left of ``procs`` (and of what the cluster started
    since: re-scanned while the driver lives); returns how many were signalled."""
    known, last_scan = set(procs), time.monotonic()
    while _alive(driver):
        time.sleep(poll_s)
        if time.monotonic() - last_scan > 2.0:
            for p in list(known):
                if _alive(p):  # never walk below a pid that now belongs to someone else
                    known.update(descendants(p[0]))
            last_scan = time.monotonic()
    procs = sorted(known)
    left = [p for p in procs if _alive(p)]
    for pid, _ in left:
        try:
            os.kill(pid, signal.SIGTERM)
        except OSError:
            pass
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and any(_alive(p) for p in left):
        time.sleep(0.2)
    for p in left:
        if _alive(p):
            try:
                os.kill(p[0], signal.SIGKILL)
            except OSError:
                pass
    return len(left)


if __name__ == "__main__":
    d = json.loads(sys.argv[1])
    reap((int(d[0]), int(d[1])), [(int(a), int(b)) for a, b in json.loads(sys.argv[2])])
