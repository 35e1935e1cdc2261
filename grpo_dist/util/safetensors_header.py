"""What a ``.safetensors`` file says about itself, read without loading it: an 8-byte little-endian
header length, a JSON header (tensor name -> dtype, shape, ``data_offsets`` into the data that
follows), then the data. A file whose size is not exactly what its header says is one the
safetensors loader refuses ("incomplete metadata, file not fully covered"), deep inside vLLM or
transformers and without the file's name; here it is one sentence naming the file.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

MAX_HEADER = 100_000_000  # the safetensors format's own limit
LFS_POINTER = b"version https://git-lfs"
AGAIN = "copy or download it again"


class WeightsError(ValueError):
    """One sentence: the file and what is wrong with it."""


def human(n: int, like: int | None = None) -> str:
    """``n`` bytes in kB/MB/GB (the unit ``like`` would get, so two sizes compare at a glance)."""
    ref = n if like is None else like
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if ref >= size:
            return f"{n / size:.{2 if unit == 'GB' else 1}f} {unit}"
    return f"{n} bytes"


def read_header(path: str | Path) -> dict[str, Any]:
    """The JSON header of ``path`` (``__metadata__`` removed), checked against the file's size:
    WeightsError naming the file when it is truncated, longer than its tensors, corrupt, or not a
    safetensors file at all (a Git LFS pointer, an error page saved as the file)."""
    path = Path(path)
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        head = f.read(8)
        if head.startswith(LFS_POINTER[:8]) and (head + f.read(len(LFS_POINTER) - 8)) == LFS_POINTER:
            raise WeightsError(f"{path} is a Git LFS pointer, not the weights (run `git lfs pull` in {path.parent}, "
                               f"or download the file itself)")
        if len(head) < 8:
            raise WeightsError(f"{path} is truncated: {size} bytes, not even the 8-byte header length; {AGAIN}")
        n = int.from_bytes(head, "little")
        if n > MAX_HEADER:
            raise WeightsError(f"{path} is not a safetensors file (its first 8 bytes {head!r} are no header length; "
                               f"{human(size)}); {AGAIN}")
        if 8 + n > size:
            raise WeightsError(f"{path} is truncated inside its header: the header is {human(n)}, the file holds "
                               f"{human(size, n)}; {AGAIN}")
        raw = f.read(n)
    try:
        header = json.loads(raw)
        if not isinstance(header, dict):
            raise ValueError(f"a JSON {type(header).__name__}, not an object")
        header.pop("__metadata__", None)
        ends = [int(t["data_offsets"][1]) for t in header.values()]
    except (ValueError, KeyError, TypeError, IndexError) as e:
        why = f"not JSON: {e}" if isinstance(e, json.JSONDecodeError) else f"not a tensor table: {e}"
        raise WeightsError(f"{path} has a corrupt header ({str(why).splitlines()[0][:120]}); {AGAIN}") from None
    want, have = max(ends, default=0), size - 8 - n
    if have < want:
        raise WeightsError(f"{path} is truncated: its header says {human(want)} of tensors ({len(header)} tensors), "
                           f"the file holds {human(have, want)}; {AGAIN}")
    if have > want:
        raise WeightsError(f"{path} has {human(have - want)} after its last tensor (its header says {human(want)} of "
                           f"tensors, the file holds {human(have, want)}): not one whole safetensors file; {AGAIN}")
    return header


def shapes(path: str | Path) -> dict[str, list[int]]:
    """Tensor name -> shape, from the header alone."""
    return {name: list(t.get("shape", [])) for name, t in read_header(path).items()}
