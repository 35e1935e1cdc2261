"""Turn a public dataset into the jsonl files the data loader takes.

    python -m grpo_dist.data.prepare gsm8k --out data/gsm8k

writes ``data/gsm8k/train.jsonl`` (7473 rows) and ``data/gsm8k/test.jsonl`` (1319 rows) from
the hub's ``openai/gsm8k`` (config ``main``), one JSON object per line:
``{"prompt": <question>, "answer": <the number after ####>, "solution": <the full worked answer>}``.
``data.path: data/gsm8k/train.jsonl`` then trains on it and ``data.eval_path: auto`` evaluates
on ``test.jsonl``. ``--source`` reads another copy in any ``data.path`` format (a directory saved
with ``datasets.save_to_disk``, ``hf:<name>:<config>``).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from typing import Any

from grpo_dist.data.sources import _read_rows

__all__ = ["gsm8k_answer", "prepare_gsm8k"]

GSM8K_SOURCE = "hf:openai/gsm8k:main"
_FINAL = re.compile(r"####\s*(.+?)\s*$", re.DOTALL)


def gsm8k_answer(solution: str) -> str:
    """The final answer of a GSM8K solution: the text after ``####``, thousands separators
    removed ("#### 1,234" -> "1234"). ValueError when there is no ``####``."""
    m = _FINAL.search(solution or "")
    if not m:
        raise ValueError(f"no '####' final answer in {solution[-80:]!r}")
    return re.sub(r"(?<=\d),(?=\d{3}\b)", "", m.group(1).strip())


def prepare_gsm8k(out_dir: str, source: str = GSM8K_SOURCE, splits: tuple[str, ...] = ("train", "test"),
                  log=print) -> dict[str, int]:
    """Write ``<out_dir>/<split>.jsonl`` for each split of ``source``; rows per split."""
    os.makedirs(out_dir, exist_ok=True)
    counts = {}
    for split in splits:
        rows: list[dict[str, Any]] = _read_rows(source, split, None)
        path = os.path.join(out_dir, f"{split}.jsonl")
        with open(path + ".tmp", "w", encoding="utf-8") as f:
            for i, row in enumerate(rows):
                try:
                    answer = gsm8k_answer(row["answer"])
                except (KeyError, ValueError) as e:
                    raise ValueError(f"{source} {split} row {i}: {e}") from None
                f.write(json.dumps({"prompt": row["question"], "answer": answer, "solution": row["answer"]}) + "\n")
        os.replace(path + ".tmp", path)
        counts[split] = len(rows)
        log(f"wrote {path} ({len(rows)} rows)")
    return counts


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m grpo_dist.data.prepare", description=__doc__.split("\n\n")[0])
    p.add_argument("dataset", choices=["gsm8k"], help="which dataset")
    p.add_argument("--out", required=True, help="output directory (<split>.jsonl files)")
    p.add_argument("--source", default=GSM8K_SOURCE, help=f"where to read it (default {GSM8K_SOURCE})")
    args = p.parse_args(argv)
    try:
        prepare_gsm8k(args.out, args.source)
    except (ValueError, FileNotFoundError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
