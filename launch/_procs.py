"""The processes of a Ray node started by launch/start_head.sh or start_worker.sh, and stopping them.

  _procs.py start PIDFILE ROLE -- ray start ...   run `ray start` in a session of its own and write
                                                  PIDFILE: that session's id and every process in it
  _procs.py stop [--timeout S] PIDFILE ...        stop those processes: SIGTERM, then SIGKILL after S s
  _procs.py list PIDFILE                          print the pids of the node (one a line)

A node's processes are: those of its session (`ray start` runs under setsid, and every process Ray
starts on the node stays in it: GCS, raylet, dashboard, agents, workers) and their descendants
(a job's driver runs in a session of its own under a worker of this one). Only those: never a
process of another head, worker or `ray.init` on this machine (`ray stop` stops them all).

Linux only (/proc); the Python standard library only (any python3 runs it).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

# the processes that make a node "up": `ray start` has returned once these run
CORE = {"head": {"gcs_server", "raylet"}, "worker": {"raylet"}}


def _stat(pid: int) -> tuple[int, int, int, str] | None:
    """(ppid, session id, start time in clock ticks, name) of ``pid``, None when it is gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    name = raw[raw.index("(") + 1: raw.rindex(")")]
    f = raw[raw.rindex(")") + 2:].split()  # fields from the 3rd (state) on
    if f[0] in ("Z", "X"):  # a zombie is gone for our purpose (its parent reaps it)
        return None
    return int(f[1]), int(f[3]), int(f[19]), name


def _all() -> dict[int, tuple[int, int, int, str]]:
    out = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            st = _stat(int(d))
            if st is not None:
                out[int(d)] = st
    return out


def members(record: dict) -> dict[int, tuple[int, int, int, str]]:
    """The node's live processes: its session's, their descendants', and the recorded ones that
    still run (same pid and start time). A session id is not reused while any process of the
    session lives, so the session's members are the node's as long as one recorded process runs."""
    procs = _all()
    recorded = {int(p["pid"]): int(p["start"]) for p in record["processes"]}
    alive = {pid for pid, start in recorded.items() if pid in procs and procs[pid][2] == start}
    found = set(alive)
    if alive:
        found |= {pid for pid, st in procs.items() if st[1] == record["sid"] and st[2] >= record["sid_start"]}
    children: dict[int, list[int]] = {}
    for pid, st in procs.items():
        children.setdefault(st[0], []).append(pid)
    todo = list(found)
    while todo:
        for c in children.get(todo.pop(), []):
            if c not in found:
                found.add(c)
                todo.append(c)
    found.discard(os.getpid())
    return {pid: procs[pid] for pid in found}


def _session(sid: int) -> dict[int, tuple[int, int, int, str]]:
    return {pid: st for pid, st in _all().items() if st[1] == sid}


def _record(path: Path, role: str, sid: int, sid_start: int, argv: list[str]) -> dict:
    procs = _session(sid)
    record = {"role": role, "sid": sid, "sid_start": sid_start, "started": time.time(), "command": argv,
              "processes": [{"pid": pid, "start": st[2], "name": st[3]} for pid, st in sorted(procs.items())]}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(record, indent=1))
    tmp.replace(path)
    return record


def start(path: Path, role: str, argv: list[str]) -> int:
    """Run ``argv`` (`ray start ...`) in a new session; once the node's core processes run, record
    them in ``path``. Without --block `ray start` returns after starting them; with --block this
    waits with it, and a SIGINT/SIGTERM stops the node."""
    if path.is_file():
        old = json.loads(path.read_text())
        if members(old):
            print(f"a Ray {old['role']} started by these scripts is still running (pid file {path}); stop it first "
                  f"with launch/stop_cluster.sh {path}", file=sys.stderr)
            return 2
        path.unlink()
    proc = subprocess.Popen(argv, start_new_session=True)
    sid, sid_start = proc.pid, (_stat(proc.pid) or (0, 0, 0, ""))[2]
    record = None

    def on_signal(signum, _frame):
        if record is not None:
            stop([path], timeout=15.0)
        else:
            os.killpg(sid, signal.SIGTERM)
        sys.exit(128 + signum)

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    while True:
        try:
            rc = proc.wait(timeout=1.0)
        except subprocess.TimeoutExpired:  # --block, or still starting
            if record is None and CORE[role] <= {st[3] for st in _session(sid).values()}:
                record = _record(path, role, sid, sid_start, argv)
            continue
        break
    if rc != 0:  # a failed start leaves nothing behind
        if _session(sid):
            tmp = {"sid": sid, "sid_start": sid_start, "processes": [{"pid": p, "start": st[2]} for p, st in
                                                                     _session(sid).items()]}
            _stop_record(tmp, 15.0, "the failed start's")
        path.unlink(missing_ok=True)
        return rc
    if record is None:  # `ray start` returned: the node runs
        record = _record(path, role, sid, sid_start, argv)
    names = sorted({p["name"] for p in record["processes"]})
    print(f"{role} processes ({', '.join(names)}) recorded in {path}; stop them (and only them) with: "
          f"launch/stop_cluster.sh {path}")
    return rc


def _signal(pids, sig) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def _stop_record(record: dict, timeout: float, what: str) -> tuple[int, int]:
    """SIGTERM every process of the node, SIGKILL what is left after ``timeout`` s; returns
    (stopped by SIGTERM, killed)."""
    targets = members(record)
    if not targets:
        return 0, 0
    start = {pid: st[2] for pid, st in targets.items()}
    _signal(targets, signal.SIGTERM)
    deadline = time.monotonic() + timeout

    def left() -> dict:
        now = members(record)  # a process it starts while stopping belongs to it too
        return {pid: st for pid, st in now.items() if pid not in start or st[2] == start[pid]}

    remaining = left()
    while remaining and time.monotonic() < deadline:
        time.sleep(0.2)
        remaining = left()
    killed = len(remaining)
    if remaining:
        names = ", ".join(sorted({st[3] for st in remaining.values()}))
        print(f"{what}: {killed} process(es) still running {timeout:g} s after SIGTERM ({names}): SIGKILL",
              file=sys.stderr)
        for _ in range(50):
            _signal(remaining, signal.SIGKILL)
            time.sleep(0.2)
            remaining = left()
            if not remaining:
                break
    return len(targets) - killed, killed


def stop(paths: list[Path], timeout: float) -> int:
    rc = 0
    for path in paths:
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError) as e:
            print(f"{path}: not a pid file of launch/start_*.sh ({e})", file=sys.stderr)
            rc = 1
            continue
        t0 = time.monotonic()
        n = len(members(record))
        termed, killed = _stop_record(record, timeout, f"{record['role']} {path.name}")
        path.unlink(missing_ok=True)
        if n == 0:
            print(f"{record['role']} ({path}): no process left running")
        else:
            print(f"{record['role']} ({path}): stopped {n} process(es) in {time.monotonic() - t0:.1f} s "
                  f"({termed} on SIGTERM, {killed} on SIGKILL)")
    return rc


def main(argv: list[str]) -> int:
    if argv[:1] == ["start"] and "--" in argv:
        i = argv.index("--")
        path, role = argv[1:i]
        return start(Path(path), role, argv[i + 1:])
    if argv[:1] == ["stop"]:
        timeout, rest = 15.0, argv[1:]
        if rest[:1] == ["--timeout"]:
            timeout, rest = float(rest[1]), rest[2:]
        return stop([Path(p) for p in rest], timeout)
    if argv[:1] == ["list"] and len(argv) == 2:
        for pid, st in sorted(members(json.loads(Path(argv[1]).read_text())).items()):
            print(pid, st[3])
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
