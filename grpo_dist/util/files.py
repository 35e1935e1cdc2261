"""A directory tree as ``{relative path: bytes}``: how learner checkpoints and adapters travel
between the learner ranks' nodes and the driver's output_dir; and an exclusive lock file, so two
processes never build into one place at once.

Durable writes: a file's data and its name reach the disk separately, and a rename can reach it
before either. ``write_tree`` fsyncs each file, then each directory it wrote into (deepest first),
so a directory renamed into place afterwards (``disk.replace_dir``, which fsyncs the parent) holds
whole files after a power cut or kernel crash, not zero-length ones."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from grpo_dist.util.disk import fsync_dir, writing


@contextlib.contextmanager
def locked(path: str | os.PathLike):
    """Hold an exclusive ``flock`` on the file ``path`` (created if missing) for the block."""
    import fcntl

    with open(path, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def read_tree(root: str | os.PathLike) -> dict[str, bytes]:
    """Every file under ``root``: relative POSIX path -> bytes."""
    root = Path(root)
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def write_tree(root: str | os.PathLike, files: dict[str, bytes], durable: bool = True) -> None:
    """Write ``read_tree``'s mapping under ``root`` (refusing paths that leave it); a failed write
    is a ``disk.WriteError`` naming the file. ``durable``: each file fsynced once written, then
    every directory written into, up to ``root`` (the module doc); scratch copies that no one
    reads after a crash pass False."""
    root = Path(root).resolve()
    dirs: set[Path] = {root}
    for rel, data in files.items():
        out = (root / rel).resolve()
        if root not in out.parents:
            raise ValueError(f"refusing to write {rel!r} outside {root}")
        with writing(out):
            out.parent.mkdir(parents=True, exist_ok=True)
            with open(out, "wb") as f:
                f.write(data)
                if durable:
                    f.flush()
                    os.fsync(f.fileno())
        dirs.update(p for p in out.parents if p == root or root in p.parents)
    if durable:
        _sync_dirs(dirs)


def sync_tree(root: str | os.PathLike) -> None:
    """fsync every file and directory under ``root`` (deepest first, ``root`` last): for files that
    another writer made (DeepSpeed's, on a shared filesystem)."""
    root = Path(root)
    dirs: set[Path] = {root}
    for p in root.rglob("*"):
        if p.is_dir():
            dirs.add(p)
        elif p.is_file():
            with writing(p):
                fd = os.open(p, os.O_RDONLY)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
    _sync_dirs(dirs)


def _sync_dirs(dirs: set[Path]) -> None:
    for d in sorted(dirs, key=lambda p: len(p.parts), reverse=True):  # a directory's entry after its contents
        with writing(d):
            fsync_dir(d)
