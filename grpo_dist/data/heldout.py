"""Where the held-out prompts come from when ``data.eval_path`` is ``auto`` (the default).

Evaluation follows the training data: the source's own test split when it has one, otherwise a
seeded slice of the training prompts, held out of training.

* ``builtin:<task>``: the task's ``eval`` split (disjoint from ``train`` by construction);
* ``hf:<name>[:<config>]`` and directories saved with ``datasets.save_to_disk``: the ``test``
  split, else ``validation``;
* a file whose name contains ``train`` (``data/gsm8k/train.jsonl``): the file of the same name
  with ``test`` (``data/gsm8k/test.jsonl``), when it exists.
"""

from __future__ import annotations

import json
import os
import random
from typing import Any

from grpo_dist.data.sources import BUILTIN_PREFIX, HF_PREFIX

AUTO = "auto"
TEST_SPLITS = ("test", "validation")

__all__ = ["AUTO", "TEST_SPLITS", "hold_out", "test_split_of"]


def _split_names(source: str) -> list[str] | None:
    """The split names of a hub dataset or a saved dataset directory; None if it has none."""
    if source.startswith(HF_PREFIX):
        from datasets import get_dataset_split_names

        repo, _, config = source[len(HF_PREFIX):].partition(":")
        try:
            return list(get_dataset_split_names(repo, config or None))
        except Exception:  # noqa: BLE001 - no split listing (offline and not cached): no test split
            return None
    meta = os.path.join(os.path.expanduser(source), "dataset_dict.json")
    if os.path.isfile(meta):
        with open(meta, encoding="utf-8") as f:
            return list(json.load(f).get("splits", []))
    return None


def test_split_of(source: str, split: str | None) -> tuple[str, str | None] | None:
    """``(eval_source, eval_split)``: the held-out split of the training source ``source``
    (trained on ``split``), or None when it has none (see the module doc)."""
    if source.startswith(BUILTIN_PREFIX):
        return None if split == "eval" else (source, "eval")
    names = _split_names(source)
    if names is not None:
        found = next((s for s in TEST_SPLITS if s in names and s != split), None)
        return (source, found) if found else None
    path = os.path.expanduser(source)
    head, base = os.path.split(path)
    i = base.rfind("train")
    if os.path.isfile(path) and i >= 0:
        for name in TEST_SPLITS:
            sibling = os.path.join(head, base[:i] + name + base[i + len("train"):])
            if os.path.isfile(sibling):
                return sibling, None
    return None


def hold_out(records: list[Any], n: int, seed: int) -> tuple[list[Any], list[Any]]:
    """``(train, held_out)``: ``n`` records picked with ``seed`` (at most half of them, at least one
    left to train on), both lists in their original order."""
    n = min(n, len(records) // 2)
    picked = set(random.Random(seed).sample(range(len(records)), n)) if n > 0 else set()
    return ([r for i, r in enumerate(records) if i not in picked],
            [r for i, r in enumerate(records) if i in picked])
