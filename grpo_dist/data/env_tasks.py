"""Built-in tasks for the environments (grpo_dist/envs/builtin.py).

* ``tool_problems``: arithmetic word problems for tool use with two- and three-digit numbers (products,
  sums, change), answer an integer; the ``question`` column holds the problem text (the prompt is
  the same text), for the calculator and code-tool environments;
* ``guess_number``: "I am thinking of a whole number from 1 to ``hi``", answer the number, for
  the guess-the-number feedback environment.

The train/eval split is a fixed property of each item's text (a hash), never of a run's seed.
"""

from __future__ import annotations

import hashlib
import random
from typing import Any

from grpo_dist.data.synthetic import Task, register_task
from grpo_dist.types import PromptRecord

_NAMES = ["Ana", "Ben", "Chen", "Dara", "Eli", "Fatima", "Gus", "Hana", "Ivan", "Jo"]


def _eval_item(text: str, eval_fraction: float) -> bool:
    h = int.from_bytes(hashlib.sha1(text.encode()).digest()[:8], "big")
    return h % 10_000 < eval_fraction * 10_000


def _problem(rng: random.Random) -> tuple[str, int]:
    name = rng.choice(_NAMES)
    kind = rng.randrange(6)
    if kind == 0:
        a, b = rng.randint(12, 99), rng.randint(12, 99)
        return f"A shop sells {a} boxes of pencils with {b} pencils in each box. How many pencils does it sell?", a * b
    if kind == 1:
        a, b = rng.randint(100, 999), rng.randint(100, 999)
        c = rng.randint(50, a + b - 1)
        return (f"{name} had {a} coins, found {b} more, then spent {c}. How many coins does {name} have now?",
                a + b - c)
    if kind == 2:
        a, b, c = rng.randint(11, 60), rng.randint(11, 60), rng.randint(10, 99)
        return f"A farm has {a} rows of {b} trees and plants {c} more trees. How many trees are there now?", a * b + c
    if kind == 3:
        a, k = rng.randint(3, 24), rng.randint(11, 99)
        return (f"{a} students share {a * k} stickers equally. How many stickers does each student get?", k)
    if kind == 4:
        a, b, c = rng.randint(120, 480), rng.randint(3, 12), rng.randint(10, 99)
        return f"A train travels {a} km each day for {b} days, then {c} km more. How many km does it travel in all?", \
            a * b + c
    a, b = rng.randint(3, 19), rng.randint(12, 95)
    c = (a * b // 100 + 1 + rng.randint(0, 3)) * 100
    return (f"{name} buys {a} tickets at {b} dollars each and pays with {c} dollars. How many dollars of change "
            f"does {name} get?", c - a * b)


class WordProblems(Task):
    name = "tool_problems"

    def __init__(self):
        self._cache: dict[tuple, tuple[list, list]] = {}

    def pool(self, split: str, size: int = 4000, eval_fraction: float = 0.1) -> list[tuple[str, str, dict[str, Any]]]:
        key = (int(size), float(eval_fraction))
        if key not in self._cache:
            rng, seen, train, held = random.Random(0x0C41C), set(), [], []
            want_eval = max(1, int(size * eval_fraction))
            tries = 0
            while (len(train) < size or len(held) < want_eval) and tries < 50 * size:
                tries += 1
                text, ans = _problem(rng)
                if text in seen:
                    continue
                seen.add(text)
                dest = held if _eval_item(text, eval_fraction) else train
                if len(dest) < (want_eval if dest is held else size):
                    dest.append((text, str(ans), {"question": text}))
            self._cache[key] = (train, held)
        train, held = self._cache[key]
        return train if split == "train" else held

    def wrong_answers(self, record: PromptRecord, noise: str = "systematic") -> list[str]:
        return [str(int(record.columns["answer"]) + 1)]


class GuessNumber(Task):
    name = "guess_number"

    def pool(self, split: str, hi: int = 100, eval_fraction: float = 0.1) -> list[tuple[str, str, dict[str, Any]]]:
        out = []
        for target in range(1, int(hi) + 1):
            text = (f"I am thinking of a whole number from 1 to {hi}. Guess it: reply with one number, and I will "
                    f"say whether mine is higher or lower.")
            held = _eval_item(f"{hi}:{target}", eval_fraction)
            if held == (split != "train"):
                out.append((text, str(target), {"question": text, "hi": int(hi)}))
        return out

    def wrong_answers(self, record: PromptRecord, noise: str = "systematic") -> list[str]:
        return [str(int(record.columns["answer"]) + 1)]


register_task(WordProblems())
register_task(GuessNumber())
