"""A directory tree as ``{relative path: bytes}``: how learner checkpoints and adapters travel
between the learner ranks' nodes and the driver's output_dir; and an exclusive lock file, so two
processes never build into one place at once."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from grpo_dist.util.disk import writing


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


def write_tree(root: str | os.PathLike, files: dict[str, bytes]) -> None:
    """Write ``read_tree``'s mapping under ``root`` (refusing paths that leave it); a failed write
    is a ``disk.WriteError`` naming the file."""
    root = Path(root).resolve()
    for rel, data in files.items():
        out = (root / rel).resolve()
        if root not in out.parents:
            raise ValueError(f"refusing to write {rel!r} outside {root}")
        with writing(out):
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_bytes(data)
