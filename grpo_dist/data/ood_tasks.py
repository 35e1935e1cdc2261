"""Held-out sets phrased another way: ``builtin:word_problems_ood`` and ``builtin:tool_problems_ood``.

The held-out split of ``builtin:word_problems`` (and of ``builtin:tool_problems``) comes from the
training generator itself: the same sentence templates, names, items and instruction, other
numbers. A model can score well on it by learning the generator. These two sets test transfer
instead; they are built another way and are evaluation sets only (``split=train`` is an error):

* ``word_problems_ood``: arithmetic word problems with other sentence templates, other names and
  items and several instruction wordings (each still asks for the answer in ``\\boxed{}``, so the
  ``math`` reward scores them); half additions and subtractions, half products and equal shares,
  numbers up to ``max_number`` (default 100, beyond the training recipe's difficulty 1, whose
  numbers stop at 20);
* ``tool_problems_ood``: problems for the calculator environment (``question`` column), other
  templates and names than ``tool_problems``, bigger numbers (mostly five-digit amounts and answers,
  where ``tool_problems``' numbers and answers stay under 10,000).

No sentence of either set could come from the training generators' templates
(tests/test_ood_tasks.py checks it sentence by sentence). Both are deterministic: a fixed pool
per parameter set, drawn from with the source's ``seed``.
"""

from __future__ import annotations

import random
from typing import Any, Callable

from grpo_dist.data.synthetic import PromptRecord, Task, register_task

INSTRUCTIONS = (
    "Write the final number inside \\boxed{}.",
    "Give the result as \\boxed{N}, where N is the number.",
    "Work it out step by step, then state the result in \\boxed{}.",
    "End your reply with the answer in the form \\boxed{answer}.",
)
NAMES = [("Priya", "she"), ("Diego", "he"), ("Hiro", "he"), ("Olga", "she"), ("Kwame", "he"), ("Ingrid", "she"),
         ("Tariq", "he"), ("Lucia", "she"), ("Mateo", "he"), ("Amara", "she"), ("Sven", "he"), ("Yuki", "she")]
ITEMS = ["buttons", "beads", "postcards", "walnuts", "candles", "badges", "pebbles", "tickets", "ribbons", "plums"]
POOL_TRIES = 20_000
_SALT = 0x0D0D

Problem = tuple[str, int, str]  # (text without the instruction, answer, kind)


def _who(rng: random.Random) -> tuple[str, str, str]:
    name, pron = rng.choice(NAMES)
    return name, pron, "her" if pron == "she" else "his"


def _add(rng: random.Random, m: int) -> Problem:
    name, pron, poss = _who(rng)
    it, a, b = rng.choice(ITEMS), rng.randint(10, m), rng.randint(10, m)
    t = rng.randrange(4)
    if t == 0:
        text = (f"On Monday a library lent out {a} novels, and on Tuesday it lent out {b}. What is the number of "
                f"novels lent out over the two days?")
    elif t == 1:
        text = (f"{name}'s jar holds {a} {it}. {poss.capitalize()} uncle puts another {b} {it} into the jar. "
                f"Find the number of {it} in the jar now.")
    elif t == 2:
        text = (f"A bus carries {a} passengers. At the next stop {b} people climb aboard and nobody leaves. "
                f"Count the passengers on the bus.")
    else:
        text = (f"A farmer picked {a} pumpkins in the morning and {b} pumpkins in the afternoon. Altogether, what "
                f"number of pumpkins did the farmer pick?")
    return text, a + b, "add"


def _sub(rng: random.Random, m: int) -> Problem:
    name, pron, poss = _who(rng)
    it, a = rng.choice(ITEMS), rng.randint(30, m)
    b = rng.randint(5, a - 1)
    t = rng.randrange(4)
    if t == 0:
        text = f"A baker made {a} muffins and customers bought {b} of them. What number of muffins remain unsold?"
    elif t == 1:
        text = (f"{name} set out with {a} {it} in {poss} bag and handed out {b} of them at school. "
                f"What number of {it} are still in the bag?")
    elif t == 2:
        text = (f"A tank held {a} litres of water until {b} litres leaked out. What amount of water, in litres, "
                f"stays in the tank?")
    else:
        text = f"There were {a} birds on a wire before {b} flew off. Find the number of birds that stayed."
    return text, a - b, "sub"


def _mul(rng: random.Random, m: int) -> Problem:
    name, pron, _ = _who(rng)
    it, a, b = rng.choice(ITEMS), rng.randint(3, 12), rng.randint(11, max(12, m // 4))
    t = rng.randrange(4)
    if t == 0:
        text = f"Each of the {a} classrooms in a school holds {b} desks. What is the total number of desks?"
    elif t == 1:
        text = f"{name} saves {b} dollars every week for {a} weeks. What sum of money, in dollars, does {pron} save?"
    elif t == 2:
        text = f"A crate contains {b} {it}, and a van is loaded with {a} crates. Find the number of {it} in the van."
    else:
        text = f"A garden has {a} flower beds, with {b} tulips planted in every bed. Work out the number of tulips."
    return text, a * b, "mul"


def _div(rng: random.Random, m: int) -> Problem:
    name, _, _ = _who(rng)
    it, k, q = rng.choice(ITEMS), rng.randint(3, 12), rng.randint(6, max(7, m // 4))
    total = k * q
    t = rng.randrange(4)
    if t == 0:
        text = f"{name} splits {total} {it} evenly into {k} bowls. What number of {it} end up in every bowl?"
    elif t == 1:
        text = f"A coach divides {total} players into {k} teams of the same size. Find the size of one team."
    elif t == 2:
        text = f"Exactly {total} litres of juice are poured in equal parts into {k} jugs. What volume, in litres, is in one jug?"
    else:
        text = (f"A ribbon {total} centimetres long is cut into {k} pieces of equal length. What is the length of "
                f"one piece, in centimetres?")
    return text, q, "div"


WORD_KINDS: list[Callable[[random.Random, int], Problem]] = [_add, _sub, _mul, _div]


def _eval_only(task: str, split: str) -> None:
    if split == "train":
        raise ValueError(f"{task} is an evaluation set only (split=eval); train on its in-distribution twin")


def _balanced(make: Callable[[random.Random], tuple[str, int, str]], seed: int) -> list[tuple[str, int, str]]:
    """Distinct problems of every kind, as many of each kind as the rarest has (a seeded draw of
    ``POOL_TRIES`` candidates, in order of first appearance)."""
    rng, by_kind = random.Random(seed), {}
    for _ in range(POOL_TRIES):
        text, ans, kind = make(rng)
        by_kind.setdefault(kind, {}).setdefault(text, ans)
    n = min(len(v) for v in by_kind.values())
    return [(t, a, k) for k in sorted(by_kind) for t, a in list(by_kind[k].items())[:n]]


class WordProblemsOOD(Task):
    name = "word_problems_ood"

    def __init__(self):
        self._cache: dict[int, list] = {}

    def _pool(self, m: int) -> list[tuple[str, str, dict[str, Any]]]:
        if m not in self._cache:
            problems = _balanced(lambda rng: rng.choice(WORD_KINDS)(rng, m), _SALT * 97 + m)
            wording = random.Random(_SALT * 97 + m + 1)  # every wording on every kind of problem
            out = []
            for text, ans, kind in problems:
                j = wording.randrange(len(INSTRUCTIONS))
                out.append((f"{text} {INSTRUCTIONS[j]}", str(ans), {"kind": kind, "instruction": j}))
            self._cache[m] = out
        return self._cache[m]

    def pool(self, split: str, max_number: int = 100) -> list[tuple[str, str, dict[str, Any]]]:
        _eval_only(self.name, split)
        m = int(max_number)
        if m < 40:
            raise ValueError(f"word_problems_ood: max_number must be >= 40, got {max_number}")
        return self._pool(m)

    def wrong_answers(self, record: PromptRecord, noise: str = "systematic") -> list[str]:
        return [str(int(record.columns["answer"]) + 1)]


# ------------------------------------------------------------------ the calculator's problems, phrased another way

TOOL_NAMES = ["Kofi", "Leila", "Marek", "Noor", "Pablo", "Rina", "Soren", "Thandi", "Umar", "Vera"]


def _tool_problem(rng: random.Random) -> tuple[str, int, str]:
    name = rng.choice(TOOL_NAMES)
    kind = rng.randrange(6)
    if kind == 0:
        a, b = rng.randint(60, 250), rng.randint(60, 250)
        return f"A warehouse stores {a} pallets, each holding {b} cans. What is the total number of cans stored?", \
            a * b, "mul"
    if kind == 1:
        a, b = rng.randint(10_000, 60_000), rng.randint(1000, 9999)
        c = rng.randint(1000, 9999)
        return (f"{name}'s savings account holds {a} dollars. After a deposit of {b} dollars and a withdrawal of "
                f"{c} dollars, what is the balance in dollars?", a + b - c, "add_sub")
    if kind == 2:
        a, b = rng.randint(40, 120), rng.randint(100, 300)
        c = rng.randint(10, 999)
        return (f"A stadium has {a} sections of {b} seats, and {c} of the seats are broken. What number of seats "
                f"can be used?", a * b - c, "mul_sub")
    if kind == 3:
        k, q = rng.randint(24, 60), rng.randint(201, 999)
        return (f"Exactly {k * q} kilograms of rice are packed into {k} sacks of equal weight. What does one sack "
                f"weigh, in kilograms?", q, "div")
    if kind == 4:
        a, b, c = rng.randint(300, 900), rng.randint(20, 45), rng.randint(100, 999)
        return (f"A cyclist rides {a} metres each minute for {b} minutes and then {c} metres more. What distance, "
                f"in metres, is covered?", a * b + c, "mul_add")
    a, b = rng.randint(20, 60), rng.randint(100, 400)
    c = (a * b // 1000 + 1 + rng.randint(0, 2)) * 1000
    return (f"{name} orders {a} lamps costing {b} dollars apiece and hands over {c} dollars. What amount of change, "
            f"in dollars, comes back?", c - a * b, "change")


class ToolProblemsOOD(Task):
    name = "tool_problems_ood"

    def __init__(self):
        self._pool: list | None = None

    def pool(self, split: str) -> list[tuple[str, str, dict[str, Any]]]:
        _eval_only(self.name, split)
        if self._pool is None:
            self._pool = [(t, str(a), {"question": t, "kind": k}) for t, a, k in _balanced(_tool_problem, _SALT * 89 + 1)]
        return self._pool

    def wrong_answers(self, record: PromptRecord, noise: str = "systematic") -> list[str]:
        return [str(int(record.columns["answer"]) + 1)]


register_task(WordProblemsOOD())
register_task(ToolProblemsOOD())
