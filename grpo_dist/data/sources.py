"""Prompt sources (local jsonl/json/parquet, saved HF datasets, built-in tasks) and PromptStream.

``load_prompts`` turns any source into a list of :class:`PromptRecord`; ``PromptStream`` walks
such a list forever, reshuffled each epoch from a seed, with a position that checkpoints can
save and restore.
"""

from __future__ import annotations

import json
import os
import random
from typing import Any, Iterable, Iterator, Mapping
from urllib.parse import parse_qsl

from grpo_dist.types import PROMPT_MESSAGES, PromptRecord

BUILTIN_PREFIX = "builtin:"
HF_PREFIX = "hf:"


# ---------------------------------------------------------------------------------- readers

def _read_jsonl(path: str) -> list[dict]:
    rows = []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{lineno}: invalid JSON: {e}") from None
            if not isinstance(row, dict):
                raise ValueError(f"{path}:{lineno}: expected a JSON object, got {type(row).__name__}")
            rows.append(row)
    return rows


def _read_json(path: str) -> list[dict]:
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    if isinstance(data, dict):  # {"data": [...]} or a dict of columns
        if "data" in data and isinstance(data["data"], list):
            data = data["data"]
        elif data and all(isinstance(v, list) for v in data.values()):
            n = len(next(iter(data.values())))
            data = [{k: v[i] for k, v in data.items()} for i in range(n)]
    if not isinstance(data, list) or not all(isinstance(r, dict) for r in data):
        raise ValueError(f"{path}: expected a JSON list of objects")
    return data


def _read_parquet(path: str) -> list[dict]:
    import pandas as pd

    return pd.read_parquet(path).to_dict(orient="records")


def _pick_split(obj: Any, split: str | None, where: str) -> Any:
    """Pick ``split`` from a DatasetDict-like mapping (default: "train", else the only/first)."""
    if not hasattr(obj, "keys"):
        return obj
    splits = list(obj.keys())
    if split is None:
        split = "train" if "train" in splits else splits[0]
    if split not in splits:
        raise ValueError(f"{where}: no split {split!r}; available splits: {splits}")
    return obj[split]


def _read_hf_disk(path: str, split: str | None) -> list[dict]:
    from datasets import Dataset, load_from_disk

    ds = load_from_disk(path)
    if not isinstance(ds, Dataset):
        ds = _pick_split(ds, split, path)
    return ds.to_list()


def _read_hf_hub(name: str, split: str | None) -> list[dict]:
    from datasets import load_dataset

    repo, _, config = name.partition(":")
    ds = load_dataset(repo, config or None, split=split or "train")
    return ds.to_list()


def _read_builtin(spec: str, split: str | None, limit: int | None) -> list[dict]:
    """``builtin:add`` or ``builtin:add?n=500&seed=1&max_operand=50``."""
    from grpo_dist.data import ood_tasks, word_problems  # noqa: F401 - register builtin:word_problems(_ood)
    from grpo_dist.data.synthetic import make_task

    name, _, query = spec[len(BUILTIN_PREFIX):].partition("?")
    params: dict[str, Any] = {}
    for k, v in parse_qsl(query, keep_blank_values=True):
        try:
            params[k] = int(v)
        except ValueError:
            try:
                params[k] = float(v)
            except ValueError:
                params[k] = v
    n = params.pop("n", None)
    seed = params.pop("seed", 0)
    split = params.pop("split", split) or "train"
    if n is None:
        n = limit if limit is not None else 1000
    records = make_task(name, n, seed=seed, split=split, **params)
    return [r.as_example() for r in records]


def _read_rows(source: str, split: str | None, limit: int | None) -> list[dict]:
    if source.startswith(BUILTIN_PREFIX):
        return _read_builtin(source, split, limit)
    if source.startswith(HF_PREFIX):
        return _read_hf_hub(source[len(HF_PREFIX):], split)
    path = os.path.expanduser(source)
    if os.path.isdir(path):
        return _read_hf_disk(path, split)
    if not os.path.exists(path):
        raise FileNotFoundError(
            f"prompt source {source!r} not found (expected a .jsonl/.json/.parquet file, a directory "
            f"saved with datasets.save_to_disk, '{BUILTIN_PREFIX}<task>' or '{HF_PREFIX}<hub name>')")
    lower = path.lower()
    if lower.endswith(".jsonl"):
        return _read_jsonl(path)
    if lower.endswith(".json"):
        return _read_json(path)
    if lower.endswith(".parquet"):
        return _read_parquet(path)
    raise ValueError(f"{source}: unsupported file type (use .jsonl, .json or .parquet)")


# ---------------------------------------------------------------------------------- load_prompts

def _to_plain(v: Any) -> Any:
    """numpy scalars/arrays (from parquet) to plain Python values."""
    if hasattr(v, "tolist") and not isinstance(v, (str, bytes)):
        return v.tolist()
    return v


def _is_messages(x: Any) -> bool:
    return isinstance(x, list) and all(isinstance(m, Mapping) and "role" in m and "content" in m for m in x)


def load_prompts(path_or_name: str, *, split: str | None = None, prompt_column: str = "prompt",
                 answer_column: str | None = "answer", column_mapping: dict[str, str] | None = None,
                 chat_template: bool = False, tokenizer: Any = None, system_prompt: str | None = None,
                 limit: int | None = None) -> list[PromptRecord]:
    """Load prompts from a file, a saved HF dataset directory, ``hf:<name>[:<config>]`` or ``builtin:<task>``.

    ``column_mapping`` renames source columns first (``{"question": "prompt"}``); then the prompt
    is read from ``prompt_column`` and the reference answer from ``answer_column`` (kept under its
    own name and as ``columns["answer"]``; ``answer_column=None`` or an absent column means no
    answer). Every other column is kept in ``columns`` under its own name. With
    ``chat_template=True`` the prompt (a string, or a list of ``{"role","content"}`` messages)
    goes through ``tokenizer.apply_chat_template`` with an optional ``system_prompt``, and the
    messages are kept as ``columns[PROMPT_MESSAGES]`` (the reward functions' conversational
    ``prompts``); ``tokenizer`` may be a tokenizer or a path for ``AutoTokenizer``.
    """
    if limit is not None and limit < 0:
        raise ValueError(f"limit must be >= 0, got {limit}")
    rows = _read_rows(str(path_or_name), split, limit)
    if limit is not None:
        rows = rows[:limit]
    if column_mapping:
        rows = [{column_mapping.get(k, k): v for k, v in r.items()} for r in rows]
    if rows and prompt_column not in rows[0]:
        raise ValueError(f"{path_or_name}: prompt column {prompt_column!r} not found; "
                         f"available columns: {sorted(rows[0])} (set prompt_column or column_mapping)")
    if chat_template:
        if tokenizer is None:
            raise ValueError("chat_template=True needs a tokenizer")
        if isinstance(tokenizer, (str, os.PathLike)):
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(str(tokenizer))

    records = []
    for i, row in enumerate(rows):
        if prompt_column not in row:
            raise ValueError(f"{path_or_name}: row {i} has no prompt column {prompt_column!r}; "
                             f"available columns: {sorted(row)}")
        prompt = _to_plain(row[prompt_column])
        # every column under its own name (TRL passes them so); the answer also as ``answer``
        columns = {k: _to_plain(v) for k, v in row.items() if k != prompt_column}
        if answer_column is not None and answer_column in row:
            columns["answer"] = _to_plain(row[answer_column])
        if chat_template:
            messages = chat_messages(prompt, system_prompt)
            prompt = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
            columns[PROMPT_MESSAGES] = messages  # the rewards' conversational ``prompts``
        elif not isinstance(prompt, str):
            hint = " (it holds chat messages: pass chat_template=True)" if _is_messages(prompt) else ""
            raise ValueError(f"{path_or_name}: row {i}: prompt column {prompt_column!r} is "
                             f"{type(prompt).__name__}, expected str{hint}")
        records.append(PromptRecord(i, prompt, columns))
    return records


def chat_messages(prompt: Any, system_prompt: str | None = None) -> list[dict[str, Any]]:
    """``prompt`` (str or messages) as the message list a chat template renders, with
    ``system_prompt`` first unless the messages start with a system message."""
    if _is_messages(prompt):
        messages = [dict(m) for m in prompt]
    elif isinstance(prompt, str):
        messages = [{"role": "user", "content": prompt}]
    else:
        raise ValueError(f"cannot apply a chat template to a {type(prompt).__name__} prompt")
    if system_prompt is not None and not (messages and messages[0].get("role") == "system"):
        messages.insert(0, {"role": "system", "content": system_prompt})
    return messages


def apply_chat_template(tokenizer: Any, prompt: Any, system_prompt: str | None = None) -> str:
    """The model input text for ``prompt`` (str or messages) under ``tokenizer``'s chat template."""
    return tokenizer.apply_chat_template(chat_messages(prompt, system_prompt), tokenize=False,
                                         add_generation_prompt=True)


# ---------------------------------------------------------------------------------- PromptStream

class PromptStream:
    """Infinite stream over ``records``: a fresh seeded permutation per epoch.

    The position (seed, epoch, index within the epoch) round-trips through
    :meth:`state_dict` / :meth:`load_state_dict`, so a resumed run continues with exactly
    the batches it would have seen.
    """

    def __init__(self, records: Iterable[PromptRecord], seed: int = 0, shuffle: bool = True):
        self.records = list(records)
        if not self.records:
            raise ValueError("PromptStream needs at least one record")
        self.seed = int(seed)
        self.shuffle = shuffle
        self.epoch = 0
        self.index = 0
        self._order = self._permutation(0)

    def __len__(self) -> int:
        return len(self.records)

    def _permutation(self, epoch: int) -> list[int]:
        order = list(range(len(self.records)))
        if self.shuffle:
            random.Random(self.seed * 1_000_003 + epoch).shuffle(order)
        return order

    def __iter__(self) -> Iterator[PromptRecord]:
        return self

    def __next__(self) -> PromptRecord:
        if self.index >= len(self._order):
            self.epoch += 1
            self.index = 0
            self._order = self._permutation(self.epoch)
        rec = self.records[self._order[self.index]]
        self.index += 1
        return rec

    def next_batch(self, n: int) -> list[PromptRecord]:
        """The next ``n`` records (crossing into the next epoch when this one runs out)."""
        if n < 0:
            raise ValueError(f"batch size must be >= 0, got {n}")
        return [next(self) for _ in range(n)]

    def state_dict(self) -> dict[str, int]:
        return {"seed": self.seed, "epoch": self.epoch, "index": self.index, "num_records": len(self.records)}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        n = state.get("num_records")
        if n is not None and int(n) != len(self.records):
            raise ValueError(f"stream state is for {n} records, this stream has {len(self.records)}")
        index = int(state["index"])
        if not 0 <= index <= len(self.records):
            raise ValueError(f"stream index {index} out of range for {len(self.records)} records")
        self.seed = int(state.get("seed", self.seed))
        self.epoch = int(state["epoch"])
        self.index = index
        self._order = self._permutation(self.epoch)
