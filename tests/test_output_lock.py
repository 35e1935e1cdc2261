"""One run per output_dir (issue 22): ``grpo-dist train`` holds ``<output_dir>/run.lock`` (host,
pid, process start) for its whole life; a second run into the directory exits 2 with one line
before any actor starts; a lock left by a dead (SIGKILLed) run is taken over with a warning.

The lock is taken by real processes here (the CLI, or a small Python process holding it through
``grpo_dist.run.lock``), never faked; only a lock file's contents are written by hand to stand
for a dead, reused or remote holder.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from grpo_dist.config import ConfigError
from grpo_dist.run.lock import LOCK_FILE, OutputLock, probe

ROOT = Path(__file__).resolve().parents[1]

# SIGINT back to Python's handler: a child of a background job (`make test &`) inherits it ignored.
HOLDER = """
import signal, sys, time
signal.signal(signal.SIGINT, signal.default_int_handler)
from grpo_dist.run.lock import OutputLock
with OutputLock(sys.argv[1]):
    print("held", flush=True)
    time.sleep(600)
"""


def _holder(out: Path) -> subprocess.Popen:
    """A process that takes the lock on ``out`` and keeps it until it is stopped."""
    p = subprocess.Popen([sys.executable, "-c", HOLDER, str(out)], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "held"
    return p


def _dead_pid() -> int:
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


def _write_lock(out: Path, **fields) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    info = {"host": socket.gethostname(), "pid": _dead_pid(), "started": "2026-11-25T10:00:00",
            "command": "grpo-dist train --config x.yaml", **fields}
    (out / LOCK_FILE).write_text(json.dumps(info))
    return out / LOCK_FILE


def test_a_held_lock_refuses_a_second_holder_and_is_removed_at_the_end(tmp_path):
    out = tmp_path / "run"
    p = _holder(out)
    try:
        for attempt in (lambda: probe(str(out)), lambda: OutputLock(str(out)).acquire()):
            with pytest.raises(ConfigError) as e:
                attempt()
            assert re.fullmatch(rf"output_dir: {out} is in use by another run \(pid {p.pid} on this host, started "
                                rf"\S+: .*\); wait for it to end or stop it, or choose another output_dir", str(e.value))
    finally:
        p.send_signal(signal.SIGINT)  # Ctrl-C: the with block's exit removes the lock
        p.wait(timeout=30)
    assert not (out / LOCK_FILE).exists()
    with OutputLock(str(out)) as lock:
        info = json.loads((out / LOCK_FILE).read_text())
        assert info["pid"] == os.getpid() and info["host"] == socket.gethostname() and lock.held
    assert not (out / LOCK_FILE).exists()


def test_a_sigkilled_holder_leaves_a_stale_lock_that_is_taken_over_with_a_warning(tmp_path):
    out = tmp_path / "run"
    p = _holder(out)
    p.kill()  # SIGKILL: nothing runs, the file stays
    p.wait()
    assert json.loads((out / LOCK_FILE).read_text())["pid"] == p.pid
    probe(str(out))  # stale: no error before the pre-flight
    said: list[str] = []
    with OutputLock(str(out), warn=said.append):
        assert json.loads((out / LOCK_FILE).read_text())["pid"] == os.getpid()
    assert len(said) == 1 and said[0].startswith(f"warning: output_dir: taking over {out / LOCK_FILE} left by pid "
                                                 f"{p.pid} on this host (started ")
    assert f"left by pid {p.pid} on this host" in said[0] and said[0].endswith("which is no longer running")


def test_a_lock_with_a_dead_pid_or_a_reused_pid_is_stale(tmp_path):
    dead = tmp_path / "dead"
    pid = json.loads(_write_lock(dead).read_text())["pid"]
    said: list[str] = []
    with OutputLock(str(dead), warn=said.append):
        pass
    assert said == [f"warning: output_dir: taking over {dead / LOCK_FILE} left by pid {pid} on this host (started "
                    f"2026-11-25T10:00:00: grpo-dist train --config x.yaml), which is no longer running"]
    # pid reuse: our parent's pid is alive, but it started long after the recorded start
    reused = tmp_path / "reused"
    _write_lock(reused, pid=os.getppid(), start_ticks=1)
    said.clear()
    with OutputLock(str(reused), warn=said.append):
        pass
    assert len(said) == 1 and said[0].endswith(f"which is no longer running (pid {os.getppid()} is now another process)")


def test_a_live_pid_without_the_lock_or_another_host_is_refused(tmp_path):
    from grpo_dist.run.lock import process_start

    live = tmp_path / "live"  # a live process of this host that does not hold the lock: not ours to take
    _write_lock(live, pid=os.getppid(), start_ticks=process_start(os.getppid()))
    with pytest.raises(ConfigError, match=rf"output_dir: {live} is in use by another run \(pid {os.getppid()} on "
                                          rf"this host"):
        OutputLock(str(live)).acquire()
    remote = tmp_path / "remote"
    lock = _write_lock(remote, host="node-7", pid=4242)
    for attempt in (lambda: probe(str(remote)), lambda: OutputLock(str(remote)).acquire()):
        with pytest.raises(ConfigError) as e:
            attempt()
        assert str(e.value) == (f"output_dir: {remote} is in use by a run on host node-7 (pid 4242, started "
                                f"2026-11-25T10:00:00: grpo-dist train --config x.yaml); if that run has ended, "
                                f"delete {lock} and run again")
    assert json.loads(lock.read_text())["host"] == "node-7"  # left as it was


def test_the_lock_is_removed_when_the_body_raises(tmp_path):
    out = tmp_path / "run"
    with pytest.raises(RuntimeError):
        with OutputLock(str(out)):
            raise RuntimeError("boom")
    assert not (out / LOCK_FILE).exists()


# ----------------------------------------------------------------------------- through the CLI


# The CLI end to end (a second `grpo-dist train` into a live run's output_dir exits 2; a resume takes
# a dead run's lock over with a warning): tests/test_console.py, on the run it already makes.
