"""In-memory datasets (the Python API's ``train_dataset`` / ``eval_dataset``) as the jsonl file a
run reads: the actors are other processes, and a file under ``output_dir`` is what ``data.path``
names, what a resume reads again and what ``config.yaml`` points at.

A ``datasets.Dataset``, a list (or tuple) of mappings, or a pandas ``DataFrame``; every value must
be JSON (strings, numbers, lists, chat messages; numpy values become lists and numbers). The file's
name carries a hash of its contents (``train-<hash>.jsonl``): the same rows give the same file,
and other rows never overwrite the file an earlier run of the directory read.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

from grpo_dist.data.sources import _is_messages, _to_plain


def dataset_rows(data: Any, key: str) -> list[dict[str, Any]]:
    """The rows of ``data``; ``ValueError`` naming ``key`` for what is not a dataset of rows."""
    kind = type(data).__name__
    if kind in ("DatasetDict", "IterableDatasetDict"):
        raise ValueError(f"{key}: a {kind} holds several splits ({', '.join(data)}); pass one, e.g. ds['train']")
    if kind == "IterableDataset":
        raise ValueError(f"{key}: an IterableDataset streams without end; pass a datasets.Dataset (e.g. "
                         f"Dataset.from_list(list(ds.take(n))))")
    if hasattr(data, "to_list") and hasattr(data, "column_names"):  # datasets.Dataset
        rows = data.to_list()
    elif hasattr(data, "to_dict") and hasattr(data, "columns"):  # pandas.DataFrame
        rows = data.to_dict(orient="records")
    elif isinstance(data, (list, tuple)):
        rows = list(data)
    else:
        raise ValueError(f"{key}: expected a datasets.Dataset, a list of dicts or a pandas DataFrame, got {kind}")
    if not rows:
        raise ValueError(f"{key}: the dataset has no rows")
    for i, row in enumerate(rows):
        if not isinstance(row, Mapping):
            raise ValueError(f"{key}: row {i} is a {type(row).__name__}, not a mapping of columns")
    return [dict(r) for r in rows]


def jsonl(rows: list[dict[str, Any]], key: str) -> bytes:
    """The rows as JSON lines; ``ValueError`` naming the row and column of a value JSON cannot hold."""
    lines = []
    for i, row in enumerate(rows):
        try:
            lines.append(json.dumps({k: _to_plain(v) for k, v in row.items()}, ensure_ascii=False))
        except (TypeError, ValueError):
            col = next(c for c, v in row.items() if not _json_ok(_to_plain(v)))
            raise ValueError(f"{key}: row {i}, column {col!r}: a {type(row[col]).__name__} is not JSON (the rows "
                             f"reach the actors as a jsonl file: strings, numbers, lists, dicts)") from None
    return ("\n".join(lines) + "\n").encode()


def _json_ok(v: Any) -> bool:
    try:
        json.dumps(v)
        return True
    except (TypeError, ValueError):
        return False


def dataset_file(data: Any, key: str, stem: str) -> tuple[str, bytes, list[dict[str, Any]]]:
    """``(file name, contents, rows)`` of an in-memory dataset: ``<stem>-<hash>.jsonl``."""
    rows = dataset_rows(data, key)
    body = jsonl(rows, key)
    return f"{stem}-{hashlib.sha256(body).hexdigest()[:12]}.jsonl", body, rows


def conversational(rows: list[dict[str, Any]], prompt_column: str) -> bool:
    """The prompts are chat messages (TRL's conversational format: they need the chat template)."""
    return bool(rows) and _is_messages(rows[0].get(prompt_column))
