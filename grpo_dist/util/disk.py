"""Writing a run's outputs so that a full disk, a read-only directory or a write that fails midway
leaves each output whole or absent and ends in one line naming the path and the cause.

- :class:`WriteError`: what every failed output write becomes (``disk full writing <path> (No
  space left on device)``, ``cannot write <path> (Read-only file system)``); the run turns it into
  its one-line stop (``run.run.Run``), the CLI prints it and exits 1.
- :func:`write_atomic`: a file written beside its final name and renamed over it when complete.
- :func:`replace_dir`: a directory built beside its final name (``.partial-<name>``) swapped in
  when complete (its parent fsynced after, :func:`fsync_dir`, so the new name survives a power
  cut); :func:`remove_dir` renames a directory out of sight before deleting it, so a deletion that
  stops midway never leaves a partial directory under the final name.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
from pathlib import Path

FULL = (errno.ENOSPC, errno.EDQUOT)  # the disk (or the user's quota) is full
PARTIAL = ".partial-"  # a directory being written: hidden, never matched by its final name's pattern
DELETING = ".deleting-"  # a directory being deleted


class WriteError(RuntimeError):
    """An output could not be written: ``path`` (the output, as the user knows it), ``errno`` and
    ``strerror`` of the OSError underneath."""

    def __init__(self, path: str | os.PathLike, err: OSError):
        self.path, self.errno, self.strerror = str(path), err.errno, err.strerror or str(err)
        what = "disk full writing" if err.errno in FULL else "cannot write"
        super().__init__(f"{what} {self.path} ({self.strerror})")

    def __reduce__(self):  # picklable (it may cross from an actor to the driver)
        return (WriteError, (self.path, OSError(self.errno, self.strerror)))

    @property
    def full(self) -> bool:
        return self.errno in FULL


@contextlib.contextmanager
def writing(path: str | os.PathLike):
    """Any OSError inside the block becomes a :class:`WriteError` naming ``path`` (one raised by an
    inner block, naming a more precise path, passes unchanged)."""
    try:
        yield
    except WriteError:
        raise
    except OSError as e:
        raise WriteError(path, e) from e


def _unlink(path: Path) -> None:
    with contextlib.suppress(OSError):
        path.unlink()


def write_atomic(path: str | os.PathLike, data: bytes | str) -> None:
    """``path`` holds ``data`` whole, or what it held before (a temp file beside it, renamed over
    it once written and flushed); :class:`WriteError` naming ``path`` when that fails."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    raw = data.encode() if isinstance(data, str) else data
    with writing(path):
        try:
            with open(tmp, "wb") as f:
                f.write(raw)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            _unlink(tmp)
            raise


def append_lines(path: str | os.PathLike, text: str) -> None:
    """Append ``text`` to ``path``; when that fails midway the file is cut back to its old length
    (best effort: nothing of a half-written line stays), then :class:`WriteError`."""
    path, data = Path(path), memoryview(text.encode())
    with writing(path):
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            start = os.fstat(fd).st_size
            try:
                while data:  # unbuffered: nothing is left to be flushed after a cut
                    data = data[os.write(fd, data):]
            except OSError:
                with contextlib.suppress(OSError):
                    os.ftruncate(fd, start)
                raise
        finally:
            os.close(fd)


_NO_DIR_SYNC = (errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EBADF)


def fsync_dir(path: str | os.PathLike) -> None:
    """Flush ``path``'s directory entries (the names created, renamed or removed in it) to the
    disk: a file's own fsync does not make its name durable, nor does a rename. A filesystem that
    cannot sync a directory (some FUSE and network ones: EINVAL) has nothing to do here."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    except OSError as e:
        if e.errno not in _NO_DIR_SYNC:
            raise
    finally:
        os.close(fd)


def partial_dir(final: str | os.PathLike) -> Path:
    """Where a directory is built before :func:`replace_dir` gives it its final name."""
    final = Path(final)
    return final.with_name(PARTIAL + final.name)


def replace_dir(tmp: str | os.PathLike, final: str | os.PathLike) -> None:
    """Give the complete directory ``tmp`` the name ``final`` (an old ``final`` is renamed away
    first and deleted after); the parent is fsynced after the rename, so the name stays after a
    power cut. ``tmp``'s files and directories must be fsynced already (``files.write_tree``): a
    rename can reach the disk before the data it names."""
    tmp, final = Path(tmp), Path(final)
    with writing(final):
        old = None
        if final.exists():
            old = final.with_name(f"{DELETING}{final.name}-{os.getpid()}")
            shutil.rmtree(old, ignore_errors=True)
            os.rename(final, old)
        try:
            os.rename(tmp, final)
        except OSError:
            if old is not None:  # the old one back under its name
                with contextlib.suppress(OSError):
                    os.rename(old, final)
            raise
        fsync_dir(final.parent)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def remove_dir(path: str | os.PathLike) -> None:
    """Delete ``path``: first renamed out of sight (hidden, so never taken for whole), then removed.
    Best effort: on a read-only disk it stays as it was."""
    path = Path(path)
    gone = path.with_name(f"{DELETING}{path.name}-{os.getpid()}")
    try:
        os.rename(path, gone)
    except OSError:
        return
    shutil.rmtree(gone, ignore_errors=True)


def clear_leftovers(directory: str | os.PathLike) -> None:
    """Remove what a stopped or killed writer left in ``directory`` (partial and half-deleted
    directories); best effort."""
    d = Path(directory)
    if not d.is_dir():
        return
    for p in d.iterdir():
        if p.name.startswith((PARTIAL, DELETING)) and p.is_dir():
            shutil.rmtree(p, ignore_errors=True)
