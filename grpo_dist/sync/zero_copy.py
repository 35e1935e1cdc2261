"""Weights that cross a process boundary without a copy of their own.

* :class:`ArrayState` -- the object store's payload: every tensor as a flat ``uint8`` numpy view
  of its own memory (any dtype, bfloat16 too) with its name, dtype and shape. Ray writes numpy
  arrays out of band: one copy into the object store when the learner's call returns (from the
  learner's own tensors: no clone, no pickle of the bytes), and every reader on the node gets
  read-only views of the store's shared memory (:meth:`ArrayState.tensors`), which the engine's
  layerwise reload reads straight into its weights. Tied tensors (one storage under two names)
  travel once.
* :func:`share` / :func:`rebuild` -- tensors passed to another process on this machine as
  handles (``torch.multiprocessing``'s reductions: a CUDA IPC handle for a GPU tensor, a shared
  memory file for a CPU one: one code path), for an engine core in a process of its own.
"""

from __future__ import annotations

import contextlib
import warnings
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator

import torch


def _dtype(name: str) -> torch.dtype:
    dt = getattr(torch, name, None)
    if not isinstance(dt, torch.dtype):
        raise ValueError(f"not a torch dtype: {name!r}")
    return dt


@dataclass
class ArrayState:
    names: list[str] = field(default_factory=list)
    dtypes: list[str] = field(default_factory=list)
    shapes: list[list[int]] = field(default_factory=list)
    arrays: list[Any] = field(default_factory=list)  # numpy uint8, or the index of an earlier entry (tied)

    @classmethod
    def of(cls, tensors: dict[str, torch.Tensor]) -> "ArrayState":
        """Views of ``tensors`` (CPU; a non-contiguous one is made contiguous, the only copy)."""
        out, seen = cls(), {}
        for name, t in tensors.items():
            t = t.detach()
            if t.device.type != "cpu":
                raise ValueError(f"ArrayState takes CPU tensors; {name} is on {t.device}")
            t = t.contiguous()
            key = (t.data_ptr(), t.dtype, tuple(t.shape))
            out.names.append(name)
            out.dtypes.append(str(t.dtype).removeprefix("torch."))
            out.shapes.append([int(s) for s in t.shape])
            if t.numel() and key in seen:
                out.arrays.append(seen[key])
                continue
            seen[key] = len(out.arrays)
            out.arrays.append(t.reshape(-1).view(torch.uint8).numpy())
        return out

    @property
    def nbytes(self) -> int:
        return int(sum(a.nbytes for a in self.arrays if not isinstance(a, int)))

    def tensors(self) -> dict[str, torch.Tensor]:
        """The tensors, as views of the arrays (read-only where Ray's are: never write to them)."""
        out: dict[str, torch.Tensor] = {}
        with warnings.catch_warnings():  # read-only object-store memory: torch warns, the views are only read
            warnings.simplefilter("ignore", UserWarning)
            for name, dt, shape, a in zip(self.names, self.dtypes, self.shapes, self.arrays):
                if isinstance(a, int):
                    out[name] = out[self.names[a]]
                    continue
                out[name] = torch.from_numpy(a).view(_dtype(dt)).view(shape)
        return out


@contextlib.contextmanager
def _file_system_sharing():
    """CPU storages shared as named shared-memory files (any process can open them; the default,
    file descriptors, needs multiprocessing's own connection to pass them)."""
    import torch.multiprocessing as tmp

    before = tmp.get_sharing_strategy()
    tmp.set_sharing_strategy("file_system")
    try:
        yield
    finally:
        tmp.set_sharing_strategy(before)


def share(named: Iterable[tuple[str, torch.Tensor]]) -> bytes:
    """The tensors as handles, pickled (``torch.multiprocessing``'s reductions): plain bytes for
    :func:`rebuild` in another process of this machine. A CPU tensor not in shared memory yet is
    moved there (one copy; none for the next share); a CUDA tensor is shared through CUDA IPC as
    it is. Keep the tensors alive until the other process has rebuilt them."""
    from multiprocessing.reduction import ForkingPickler

    import torch.multiprocessing  # noqa: F401 - registers the tensor and storage reductions

    with _file_system_sharing():
        out = []
        for name, t in named:
            t = t.detach()
            if t.device.type == "cpu":
                t = t.contiguous().share_memory_()
            out.append((name, t))
        return bytes(ForkingPickler.dumps(out))


def rebuild(handles: bytes) -> Iterator[tuple[str, torch.Tensor]]:
    """The tensors of :func:`share`'s handles, one at a time, sharing the sender's memory."""
    import pickle

    with _file_system_sharing():
        named = pickle.loads(handles)
    yield from named
