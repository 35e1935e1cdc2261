"""One run per output_dir: ``<output_dir>/run.lock``, held by ``grpo-dist train`` for its whole life.

The file holds who holds it (host, pid, the process's start as the kernel counts it, the boot,
the start time and the command); the holder also keeps an ``flock`` on it, which the kernel drops
when the process dies however it dies (SIGKILL included), so on this host a lock nobody holds is
stale whatever the file says. Without flock (a filesystem that refuses it) the pid decides: dead,
or alive but started at another time (its pid reused), or recorded before this boot, is stale.
A stale lock is taken over with a warning line. A lock written on another host is never taken:
its process cannot be seen from here, so the line names the host, the pid and the file to delete.

:func:`probe` checks the directory before the pre-flight without creating anything (a file where
the directory should be, a directory nothing can be written in, a live lock); :class:`OutputLock`
takes the lock once the pre-flight passed and removes the file at the end (normal end, error,
Ctrl-C: a context manager).
"""

from __future__ import annotations

import datetime
import errno
import json
import os
import socket
import sys
from pathlib import Path
from typing import Any, Callable

from grpo_dist.config import ConfigError
from grpo_dist.util.disk import WriteError

LOCK_FILE = "run.lock"

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX: the pid decides
    fcntl = None  # type: ignore[assignment]


def process_start(pid: int) -> int | None:
    """When process ``pid`` started, in clock ticks since boot (``/proc/<pid>/stat`` field 22),
    None where there is no /proc or no such process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[19])  # fields after "(comm)" start at field 3


def _boot_id() -> str | None:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        return True
    return True


def _command() -> str:
    argv = list(getattr(sys, "orig_argv", None) or [sys.executable, *sys.argv])
    if len(argv) > 1 and not argv[1].startswith("-"):  # a console script: grpo-dist train ...
        argv = argv[1:]
    argv[0] = os.path.basename(argv[0])
    text = " ".join(" ".join(argv).split())  # one line (a `python -c` program has several)
    return text if len(text) <= 120 else text[:119] + "…"


def _me() -> dict[str, Any]:
    return {"host": socket.gethostname(), "pid": os.getpid(), "start_ticks": process_start(os.getpid()),
            "boot_id": _boot_id(), "started": datetime.datetime.now().isoformat(timespec="seconds"),
            "command": _command()}


def _read(fd: int) -> dict[str, Any] | None:
    """The holder's record; {} for an empty file, None for one that is no record."""
    data = os.pread(fd, 65536, 0)
    if not data.strip():
        return {}
    try:
        info = json.loads(data)
    except ValueError:
        return None
    return info if isinstance(info, dict) else None


def _who(info: dict[str, Any]) -> str:
    """``started <time>: <command>`` as far as the record says."""
    started = f"started {info['started']}" if info.get("started") else ""
    command = info.get("command") or ""
    return f"{started}: {command}" if started and command else started or command


def _also(info: dict[str, Any]) -> str:
    who = _who(info)
    return f", {who}" if who else ""


def _flock(fd: int) -> bool | None:
    """Take the flock: True, False when a live process holds it, None where flock is not available."""
    if fcntl is None:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    except OSError as e:
        if e.errno in (errno.EAGAIN, errno.EACCES):
            return False
        return None  # ENOLCK, EOPNOTSUPP: a filesystem without flock
    return True


def _judge(path: Path, info: dict[str, Any] | None, flocked: bool | None) -> str:
    """Why the lock at ``path`` may be taken: "" for an empty one (nothing to say), else why it is
    stale; ConfigError for a lock that is not ours to take. ``flocked``: we hold the flock now
    (True), a live process holds it (False), no flock here (None)."""
    out = path.parent
    if info == {} and flocked is not False:
        return ""
    if info is None:
        if flocked is False:
            raise ConfigError(f"output_dir: {out} is in use by another run (its lock {path} is not readable); wait for "
                              f"it to end or stop it, or choose another output_dir")
        return "which holds no readable record"
    host, pid = info.get("host"), info.get("pid")
    if host and host != socket.gethostname():
        raise ConfigError(f"output_dir: {out} is in use by a run on host {host} (pid {pid}{_also(info)}); if that run "
                          f"has ended, delete {path} and run again")
    in_use = ConfigError(f"output_dir: {out} is in use by another run (pid {pid} on this host{_also(info)}); wait for "
                         f"it to end or stop it, or choose another output_dir")
    if flocked is False:
        raise in_use
    if not isinstance(pid, int):
        return "which holds no readable record"
    boot = _boot_id()
    if info.get("boot_id") and boot and info["boot_id"] != boot:
        return "which is no longer running (written before this machine restarted)"
    if not _alive(pid):
        return "which is no longer running"
    ticks, now = info.get("start_ticks"), process_start(pid)
    if ticks is not None and now is not None and ticks != now:
        return f"which is no longer running (pid {pid} is now another process)"
    raise in_use  # a live process that holds no flock (none here, or an older grpo-dist): not ours to take


def check_dir(path: str, key: str = "output_dir") -> None:
    """``path`` is (or can be made) a directory this process can create files in."""
    p = Path(path)
    where = p
    while not where.exists() and where != where.parent:
        where = where.parent
    if where.exists() and not where.is_dir():
        raise ConfigError(f"{key}: {p} is a file, not a directory" if where == p else
                          f"{key}: {p}: {where} is a file, not a directory")
    probe_file = where / f".grpo-dist-write-test-{os.getpid()}"
    try:
        os.close(os.open(probe_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        os.unlink(probe_file)
    except OSError as e:
        needed = "" if where == p else f" (to make {p})"
        raise ConfigError(f"{key}: cannot create files in {where}{needed}: {e.strerror or e}") from None


def probe(path: str) -> None:
    """Before the pre-flight, creating nothing: :func:`check_dir`, and no live or remote lock."""
    check_dir(path)
    lock = Path(path) / LOCK_FILE
    try:
        fd = os.open(lock, os.O_RDWR)
    except FileNotFoundError:
        return
    except OSError:  # unreadable: OutputLock.acquire says what is wrong
        return
    try:
        _judge(lock, _read(fd), _flock(fd))
    finally:
        os.close(fd)  # drops the flock if it was taken


class OutputLock:
    """``with OutputLock(output_dir): ...``: the run's lock, removed at the end. ``warn``: where the
    takeover of a stale lock is said (default: stderr)."""

    def __init__(self, output_dir: str, warn: Callable[[str], None] | None = None):
        self.path = Path(output_dir) / LOCK_FILE
        self.warn = warn or (lambda msg: print(msg, file=sys.stderr, flush=True))
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self) -> OutputLock:
        check_dir(str(self.path.parent))
        self.path.parent.mkdir(parents=True, exist_ok=True)
        for _ in range(20):  # the file may be removed by its holder between our open and our flock
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                flocked = _flock(fd)
                if flocked and os.fstat(fd).st_ino != _inode(self.path):
                    os.close(fd)
                    continue
                info = _read(fd)
                why = _judge(self.path, info, flocked)
            except BaseException:
                os.close(fd)
                raise
            if why:
                who = _who(info or {})
                self.warn(f"warning: output_dir: taking over {self.path} left by pid {(info or {}).get('pid', '?')} on "
                          f"this host{f' ({who})' if who else ''}, {why}")
            data = json.dumps(_me()).encode()
            try:
                os.ftruncate(fd, 0)
                os.pwrite(fd, data, 0)
                os.fsync(fd)
            except OSError as e:  # a full disk
                os.close(fd)
                raise WriteError(self.path, e) from None
            self._fd = fd
            return self
        raise ConfigError(f"output_dir: cannot take {self.path}: other processes keep replacing it")

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is None:
            return
        try:
            info = _read(fd)
            if os.fstat(fd).st_ino == _inode(self.path) and info and info.get("pid") == os.getpid():
                os.unlink(self.path)  # (not when someone removed it and another run took a new one)
        except OSError:
            pass
        finally:
            os.close(fd)

    def __enter__(self) -> OutputLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


def _inode(path: Path) -> int | None:
    try:
        return os.stat(path).st_ino
    except FileNotFoundError:
        return None
