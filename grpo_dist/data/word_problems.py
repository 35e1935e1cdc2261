"""``builtin:word_problems``: arithmetic word problems for chat models, answer in ``\\boxed{}``.

Each prompt is one short story problem in English ending with an instruction to put the final
answer within ``\\boxed{}``; the ``answer`` column is the integer answer, so the ``math`` reward
(grpo_dist/reward/math_answer.py) scores it. Use it with ``data.chat_template: true`` (the text
becomes the user message).

The difficulty knob (``builtin:word_problems?difficulty=2``, default 1):

* 1: one addition or subtraction, numbers up to 20;
* 2: one operation of the four (products up to 12 x 12, exact divisions), numbers up to 50;
* 3: two steps (e.g. a product then a difference), numbers up to 100;
* 4: three steps, numbers up to 200;
* a range, ``difficulty=1-3``: every level's problems together.

``instruction=varied`` ends each problem with one of four wordings (``VARIED_INSTRUCTIONS``, fixed
per problem) instead of the one ``INSTRUCTION``; ``instruction=<text>`` uses that text.

The train/eval split is a property of each problem (a stable hash of its template and numbers,
one in ten goes to eval), never of a seed: a held-out problem never appears in training.
"""

from __future__ import annotations

import hashlib
import random
from typing import Any, Callable

from grpo_dist.data.synthetic import PromptRecord, Task, register_task

INSTRUCTION = "Put your final answer within \\boxed{}."
# ``instruction=varied``: one of these per problem (fixed by its text); none is a wording of the held-out
# set phrased another way (ood_tasks.INSTRUCTIONS; tests/test_ood_tasks.py checks it)
VARIED_INSTRUCTIONS = (
    INSTRUCTION,
    "Answer with the number in \\boxed{}.",
    "Show your working and box the answer: \\boxed{}.",
    "What is the answer? Reply with \\boxed{} around it.",
)
EVAL_MOD = 10  # one problem in EVAL_MOD is held out
POOL_TRIES = 40_000  # candidate problems generated per difficulty (then deduplicated and split)
_SALT = 0x3A17

NAMES = [("Tom", "he"), ("Sara", "she"), ("Ali", "he"), ("Mia", "she"), ("Ben", "he"), ("Lena", "she"),
         ("Omar", "he"), ("Nora", "she"), ("Jack", "he"), ("Emma", "she"), ("Ravi", "he"), ("Zoe", "she")]
ITEMS = ["apples", "pencils", "stickers", "marbles", "cookies", "books", "stamps", "shells", "cards", "oranges"]
MAX = {1: 20, 2: 50, 3: 100, 4: 200}

Problem = tuple[str, int]  # (text without the instruction, answer)


def _who(rng: random.Random) -> tuple[str, str, str]:
    (name, pron), (friend, _) = rng.sample(NAMES, 2)
    return name, pron, friend


# ------------------------------------------------------------------ level 1: one + or -

def _add(rng, m) -> Problem:
    name, pron, _ = _who(rng)
    it, a, b = rng.choice(ITEMS), rng.randint(2, m), rng.randint(2, m)
    if rng.random() < 0.5:
        return f"{name} has {a} {it}. {pron.capitalize()} gets {b} more {it}. How many {it} does {name} have now?", a + b
    return f"There are {a} {it} in a basket and {b} {it} on the table. How many {it} are there in total?", a + b


def _sub(rng, m) -> Problem:
    name, pron, friend = _who(rng)
    it = rng.choice(ITEMS)
    a = rng.randint(3, m)
    b = rng.randint(1, a - 1)
    if rng.random() < 0.5:
        return (f"{name} had {a} {it}. {pron.capitalize()} gave {b} of them to {friend}. "
                f"How many {it} does {name} have left?", a - b)
    return f"A shop had {a} {it}. It sold {b} of them. How many {it} does the shop have left?", a - b


# ------------------------------------------------------------------ level 2: one of + - x /

def _mul(rng, m) -> Problem:
    name, _, _ = _who(rng)
    it, a, b = rng.choice(ITEMS), rng.randint(2, 12), rng.randint(2, 12)
    if rng.random() < 0.5:
        return f"{name} buys {a} packs of {it}. Each pack has {b} {it}. How many {it} does {name} buy?", a * b
    return f"There are {a} rows of chairs with {b} chairs in each row. How many chairs are there?", a * b


def _div(rng, m) -> Problem:
    name, _, _ = _who(rng)
    it, k, q = rng.choice(ITEMS), rng.randint(2, 10), rng.randint(2, 12)
    return f"{name} shares {k * q} {it} equally among {k} friends. How many {it} does each friend get?", q


# ------------------------------------------------------------------ level 3: two steps

def _mul_sub(rng, m) -> Problem:
    name, pron, friend = _who(rng)
    it, a, b = rng.choice(ITEMS), rng.randint(2, 10), rng.randint(3, 12)
    c = rng.randint(1, a * b - 1)
    return (f"{name} buys {a} boxes of {it} with {b} {it} in each box, then gives {c} {it} to {friend}. "
            f"How many {it} does {name} have now?", a * b - c)


def _add_div(rng, m) -> Problem:
    name, pron, _ = _who(rng)
    it, c, k = rng.choice(ITEMS), rng.randint(2, 9), rng.randint(2, 11)
    total = c * k
    a = rng.randint(1, total - 1)
    return (f"{name} has {a} {it} and finds {total - a} more. {pron.capitalize()} puts all of them into bags "
            f"of {c}. How many bags does {pron} fill?", k)


def _change(rng, m) -> Problem:
    name, pron, _ = _who(rng)
    a, b = rng.randint(2, 15), rng.randint(2, 6)
    bill = next(x for x in (20, 50, 100) if x > a * b)
    return (f"A ticket costs {a} dollars. {name} buys {b} tickets and pays with a {bill}-dollar bill. "
            f"How many dollars of change does {pron} get?", bill - a * b)


def _pages(rng, m) -> Problem:
    name, _, _ = _who(rng)
    a, b, c = rng.randint(5, 30), rng.randint(2, 7), rng.randint(1, m)
    return (f"{name} reads {a} pages every day for {b} days, and then {c} more pages. "
            f"How many pages does {name} read in total?", a * b + c)


# ------------------------------------------------------------------ level 4: three steps

def _three(rng, m) -> Problem:
    name, pron, friend = _who(rng)
    it, a, b, c = rng.choice(ITEMS), rng.randint(1, m // 2), rng.randint(2, 9), rng.randint(2, 12)
    d = rng.randint(1, a + b * c - 1)
    return (f"{name} has {a} {it}. {pron.capitalize()} buys {b} packs with {c} {it} in each pack, and then "
            f"gives {d} {it} to {friend}. How many {it} does {name} have now?", a + b * c - d)


def _shop(rng, m) -> Problem:
    name, pron, _ = _who(rng)
    a, b, c, d = rng.randint(2, 12), rng.randint(2, 6), rng.randint(2, 9), rng.randint(2, 5)
    total = a * b + c * d
    bill = next(x for x in (50, 100, 200, 500) if x > total)
    return (f"{name} buys {b} shirts at {a} dollars each and {d} hats at {c} dollars each, and pays with a "
            f"{bill}-dollar bill. How many dollars of change does {pron} get?", bill - total)


LEVELS: dict[int, list[Callable[[random.Random, int], Problem]]] = {
    1: [_add, _sub], 2: [_add, _sub, _mul, _div], 3: [_mul_sub, _add_div, _change, _pages], 4: [_three, _shop]}


def _is_eval(text: str) -> bool:
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big") % EVAL_MOD == 0


def _levels(difficulty: int | str) -> list[int]:
    lo, sep, hi = str(difficulty).partition("-")
    try:
        levels = list(range(int(lo), int(hi) + 1)) if sep else [int(lo)]
    except ValueError:
        levels = []
    if not levels or any(d not in LEVELS for d in levels):
        raise ValueError(f"word_problems: difficulty must be one of {sorted(LEVELS)} or a range like 1-3, "
                         f"got {difficulty}")
    return levels


def _varied(text: str) -> str:
    h = int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8, person=b"instr").digest(), "big")
    return VARIED_INSTRUCTIONS[h % len(VARIED_INSTRUCTIONS)]


class WordProblems(Task):
    name = "word_problems"

    def __init__(self):
        self._cache: dict[int, tuple[list, list]] = {}

    def _splits(self, difficulty: int) -> tuple[list, list]:
        if difficulty not in self._cache:
            rng = random.Random(_SALT * 31 + difficulty)
            seen: dict[str, int] = {}
            for _ in range(POOL_TRIES):
                text, answer = rng.choice(LEVELS[difficulty])(rng, MAX[difficulty])
                seen.setdefault(text, answer)
            train, held = [], []
            for text, answer in seen.items():
                (held if _is_eval(text) else train).append((text, answer))
            self._cache[difficulty] = (train, held)
        return self._cache[difficulty]

    def pool(self, split: str, difficulty: int | str = 1,
             instruction: str = INSTRUCTION) -> list[tuple[str, str, dict[str, Any]]]:
        """``difficulty``: a level, or a range ``a-b`` (every level's problems, each level's held-out
        ones held out); ``instruction``: the sentence after each problem, or ``varied`` (one of
        ``VARIED_INSTRUCTIONS`` per problem, fixed by its text)."""
        out = []
        for d in _levels(difficulty):
            train, held = self._splits(d)
            for text, ans in (train if split == "train" else held):
                said = _varied(text) if instruction == "varied" else instruction
                out.append((f"{text} {said}".strip(), str(ans), {"difficulty": d}))
        return out

    def wrong_answers(self, record: PromptRecord, noise: str = "systematic") -> list[str]:
        right = int(record.columns["answer"])
        return [str(right + 1)] if noise == "systematic" else [str(right + 1), str(max(0, right - 1))]


register_task(WordProblems())
