"""Reading what an offline W&B run logged (``import wandb_tables``): the records of its ``.wandb``
file (W&B's LevelDB-style log of protobuf ``Record``s: wandb 0.31 has no Python reader) and the
tables its history entries point to (``files/media/table/*.table.json``)."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

BLOCK = 32768
HEADER = 7  # checksum (4), length (2), type (1): FULL 1, FIRST 2, MIDDLE 3, LAST 4


def records(path: Path) -> list[Any]:
    """The protobuf Records of a ``.wandb`` file, in order."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = Path(path).read_bytes()
    assert data[:4] == b":W&B", f"{path}: not a W&B log"
    out, parts, pos = [], [], 7
    while pos + HEADER <= len(data):
        left = BLOCK - pos % BLOCK
        if left < HEADER:  # the block's tail is padding
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + HEADER])
        if kind == 0 and length == 0 or pos + HEADER + length > len(data):  # the end, or a record being written
            break
        parts.append(data[pos + HEADER:pos + HEADER + length])
        pos += HEADER + length
        if kind in (1, 4):
            rec = pb.Record()
            rec.ParseFromString(b"".join(parts))
            out.append(rec)
            parts = []
    return out


def finished_records(path: Path, wait_s: float = 120.0) -> list[Any]:
    """The records once the file holds the run's exit record: W&B's service may still be writing
    the last history row (and the exit) after ``run.finish()`` returned (seen on a loaded machine)."""
    import time

    deadline = time.monotonic() + wait_s
    while True:
        recs = records(path)
        if any(r.WhichOneof("record_type") == "exit" for r in recs) or time.monotonic() > deadline:
            return recs
        time.sleep(0.5)


def history(run_dir: str | Path) -> list[dict[str, Any]]:
    """Every history row logged (key -> decoded JSON value; a table's fields, logged as nested
    keys, as one dict)."""
    (log,) = Path(run_dir).glob("*.wandb")
    rows = []
    for r in finished_records(log):
        if r.WhichOneof("record_type") != "history":
            continue
        row: dict[str, Any] = {}
        for item in r.history.item:
            *outer, last = list(item.nested_key) or [item.key]
            at = row
            for k in outer:
                at = at.setdefault(k, {})
            at[last] = json.loads(item.value_json)
        rows.append(row)
    return rows


def logged_tables(run_dir: str | Path) -> dict[str, tuple[list[str], list[list[Any]]]]:
    """The last table logged under each key: (columns, rows)."""
    out = {}
    for row in history(run_dir):
        for key, v in row.items():
            if isinstance(v, dict) and v.get("_type") == "table-file":
                table = json.loads((Path(run_dir) / "files" / v["path"]).read_text())
                out[key] = (table["columns"], table["data"])
    return out
