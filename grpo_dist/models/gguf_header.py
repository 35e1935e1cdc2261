"""A few scalar fields of a GGUF file's metadata, read without parsing the rest.

``gguf.GGUFReader`` builds every field of the file as numpy views as it opens it: for a chat model
that is the whole vocabulary (~49k token strings, their scores and types), 2.6 s a file on the CI
machine, for one ``general.architecture``. This reads the key/value section in order and stops at
the last key asked for, stepping over arrays by their lengths (little-endian GGUF v2/v3, the
format's layout: https://github.com/ggml-org/ggml/blob/master/docs/gguf.md). Standard library only.
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any, BinaryIO, Iterable

MAGIC = b"GGUF"
# value type -> struct format of one element (8: string, 9: array, handled apart)
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_STRING, _ARRAY = 8, 9


class GGUFHeaderError(ValueError):
    """Not a GGUF file this reader knows (another version, big-endian, truncated)."""


def _unpack(fh: BinaryIO, fmt: str) -> Any:
    size = struct.calcsize("<" + fmt)
    raw = fh.read(size)
    if len(raw) != size:
        raise GGUFHeaderError("truncated metadata")
    return struct.unpack("<" + fmt, raw)[0]


def _string(fh: BinaryIO) -> str:
    n = _unpack(fh, "Q")
    raw = fh.read(n)
    if len(raw) != n:
        raise GGUFHeaderError("truncated string")
    return raw.decode("utf-8", errors="replace")


def _value(fh: BinaryIO, vtype: int, keep: bool) -> Any:
    if vtype in _SCALARS:
        return _unpack(fh, _SCALARS[vtype])
    if vtype == _STRING:
        return _string(fh)
    if vtype != _ARRAY:
        raise GGUFHeaderError(f"unknown value type {vtype}")
    etype, count = _unpack(fh, "I"), _unpack(fh, "Q")
    if etype in _SCALARS and not keep:  # stepped over
        fh.seek(count * struct.calcsize("<" + _SCALARS[etype]), 1)
        return None
    items = [_value(fh, etype, keep) for _ in range(count)]
    return items if keep else None


def read_metadata(path: str | Path, keys: Iterable[str]) -> dict[str, Any]:
    """``{key: value}`` for each of ``keys`` the file's metadata holds (a missing key is left out);
    GGUFHeaderError when the file is not one this reader knows."""
    wanted = set(keys)
    found: dict[str, Any] = {}
    with open(path, "rb") as fh:
        if fh.read(4) != MAGIC:
            raise GGUFHeaderError("not a GGUF file")
        version = _unpack(fh, "I")
        if version not in (2, 3):
            raise GGUFHeaderError(f"GGUF version {version} (this reader knows 2 and 3, little-endian)")
        _tensors, n_kv = _unpack(fh, "Q"), _unpack(fh, "Q")
        for _ in range(n_kv):
            if not wanted - found.keys():
                break
            key = _string(fh)
            value = _value(fh, _unpack(fh, "I"), keep=key in wanted)
            if key in wanted:
                found[key] = value
    return found
