"""Built-in synthetic tasks: seeded prompts with exact answers and a fixed held-out split.

A task turns a seed into prompts such as ``"12+34="`` whose canonical completion is the bare
answer (``"46"``, then EOS). The answer is the last integer of a completion; :meth:`Task.check`
extracts it and compares it exactly with the reference. The train/eval split is a fixed
property of the task's parameters (never of the sampling seed), so held-out prompts never
appear in training whatever seed either side uses.

New tasks subclass :class:`Task` and call :func:`register_task`.
"""

from __future__ import annotations

import operator
import random
import re
from typing import Any, Callable

from grpo_dist.types import PromptRecord

_INT_RE = re.compile(r"-?[0-9]+", re.ASCII)
NOISE_KINDS = ("near", "spread", "systematic")
_SPLIT_SALT = 0x5EED  # fixed: the held-out split must not depend on any run's seed
_SPLITS = {"train": "train", "eval": "eval", "test": "eval", "validation": "eval", "heldout": "eval"}


def extract_last_int(text: Any) -> str | None:
    """The last (ASCII) integer in ``text``, normalised (no leading zeros, no ``-0``); None if absent."""
    if not isinstance(text, str):
        return None
    found = _INT_RE.findall(text)
    if not found:
        return None
    return _normalise_int(found[-1])


def _normalise_int(s: str) -> str | None:
    s = s.strip()
    neg = s.startswith("-")
    digits = s[1:] if neg else s
    if not digits or not digits.isascii() or not digits.isdigit():
        return None
    digits = digits.lstrip("0") or "0"
    return "-" + digits if neg and digits != "0" else digits


def _split_name(split: str) -> str:
    try:
        return _SPLITS[split]
    except KeyError:
        raise ValueError(f"unknown split {split!r}; expected one of {sorted(_SPLITS)}") from None


class Task:
    """A synthetic task. Subclasses define :meth:`pool` (all items of a split, as
    ``(prompt, answer, extra_columns)`` tuples in a fixed order) and :meth:`wrong_answers`."""

    name: str = ""

    def pool(self, split: str, **kwargs: Any) -> list[tuple[str, str, dict[str, Any]]]:
        raise NotImplementedError

    def wrong_answers(self, record: PromptRecord, noise: str = "systematic") -> list[str]:
        """Plausible wrong answers for ``record`` (used to make noisy pretraining labels).

        Arithmetic: ``"systematic"`` = always the same mistake (one too many), a bias that RL
        removes quickly; ``"near"`` = off by one either way; ``"spread"`` = +-1, +-10 or a swap
        of the last two digits."""
        raise NotImplementedError

    def completion(self, answer: str) -> str:
        """The canonical completion text for ``answer`` (EOS is added by the tokenizer user)."""
        return answer

    @staticmethod
    def check(completion: Any, answer: Any) -> bool:
        """True iff the last integer of ``completion`` equals ``answer``; never raises."""
        try:
            got = extract_last_int(completion)
            want = _normalise_int(str(answer)) if answer is not None else None
            return got is not None and want is not None and got == want
        except Exception:  # malformed input of any kind is simply wrong
            return False

    def make(self, n: int | None, seed: int, split: str = "train", **kwargs: Any) -> list[PromptRecord]:
        items = self.pool(_split_name(split), **kwargs)
        if not items:
            raise ValueError(f"task {self.name!r} has no {split} items for {kwargs}")
        rng = random.Random(seed)
        order: list[int] = []
        want = len(items) if n is None else int(n)
        if want < 0:
            raise ValueError(f"n must be >= 0, got {n}")
        while len(order) < want:  # whole reshuffled passes over the pool, cut at n
            idx = list(range(len(items)))
            rng.shuffle(idx)
            order.extend(idx)
        records = []
        for i, j in enumerate(order[:want]):
            prompt, answer, extra = items[j]
            records.append(PromptRecord(i, prompt, {"answer": answer, "task": self.name, **extra}))
        return records


class ArithmeticTask(Task):
    """``a<op>b=`` with operands in ``0..max_operand``; answer ``a<op>b`` in decimal."""

    def __init__(self, name: str, symbol: str, fn: Callable[[int, int], int],
                 default_max_operand: int = 99, eval_fraction: float = 0.1, zero_pad: bool = False):
        self.name, self.symbol, self.fn = name, symbol, fn
        self.zero_pad = zero_pad
        self.default_max_operand = default_max_operand
        self.eval_fraction = eval_fraction
        self._cache: dict[tuple[int, float], tuple[list, list]] = {}

    def _splits(self, max_operand: int, eval_fraction: float) -> tuple[list, list]:
        key = (max_operand, eval_fraction)
        if key not in self._cache:
            pairs = [(a, b) for a in range(max_operand + 1) for b in range(max_operand + 1)]
            random.Random(_SPLIT_SALT).shuffle(pairs)
            n_eval = max(1, int(round(len(pairs) * eval_fraction)))
            if n_eval >= len(pairs):
                raise ValueError(f"max_operand={max_operand} is too small for a train/eval split")
            self._cache[key] = (sorted(pairs[n_eval:]), sorted(pairs[:n_eval]))
        return self._cache[key]

    def pool(self, split: str, max_operand: int | None = None, eval_fraction: float | None = None,
             zero_pad: bool | None = None) -> list[tuple[str, str, dict[str, Any]]]:
        m = self.default_max_operand if max_operand is None else int(max_operand)
        if m < 1:
            raise ValueError(f"max_operand must be >= 1, got {m}")
        frac = self.eval_fraction if eval_fraction is None else float(eval_fraction)
        train, held = self._splits(m, frac)
        pairs = train if split == "train" else held
        pad = self.zero_pad if zero_pad is None else bool(zero_pad)
        w = len(str(m)) if pad else 0  # "07+34=": fixed-width operands (one prompt length)
        return [(f"{a:0{w}d}{self.symbol}{b:0{w}d}=", str(self.fn(a, b)), {"a": a, "b": b}) for a, b in pairs]

    def wrong_answers(self, record: PromptRecord, noise: str = "systematic") -> list[str]:
        right = int(record.columns["answer"])
        cands = [right + 1] if noise == "systematic" else [right + 1, right - 1]
        if noise == "spread":
            cands += [right + 10, right - 10]
            s = str(abs(right))
            if len(s) >= 2 and s[-1] != s[-2]:  # swap the last two digits
                cands.append(int(s[:-2] + s[-1] + s[-2]) * (-1 if right < 0 else 1))
        elif noise not in NOISE_KINDS:
            raise ValueError(f"unknown noise {noise!r}; expected one of {NOISE_KINDS}")
        lo = min(0, right)  # keep wrong answers in the task's natural sign range
        out = [str(c) for c in cands if c != right and c >= lo]
        return out or [str(right + 1)]


_REGISTRY: dict[str, Task] = {}


def register_task(task: Task, *, overwrite: bool = False) -> Task:
    """Add ``task`` to the registry under ``task.name``."""
    if not task.name:
        raise ValueError("a task needs a non-empty name")
    if task.name in _REGISTRY and not overwrite:
        raise ValueError(f"task {task.name!r} is already registered")
    _REGISTRY[task.name] = task
    return task


def task_names() -> list[str]:
    return sorted(_REGISTRY)


def get_task(name: str) -> Task:
    try:
        return _REGISTRY[name]
    except KeyError:
        raise ValueError(f"unknown task {name!r}; known tasks: {task_names()}") from None


def make_task(name: str, n: int | None, seed: int = 0, split: str = "train", **kwargs: Any) -> list[PromptRecord]:
    """``n`` records of task ``name`` from ``split`` ("train" or "eval"), deterministic in ``seed``.

    Records are drawn without replacement while the split lasts (then a reshuffled pass
    follows); ``n=None`` returns the whole split once, shuffled. ``kwargs`` go to the task
    (e.g. ``max_operand``)."""
    return get_task(name).make(n, seed, split, **kwargs)


def noisy_completion(record: PromptRecord, rng: random.Random, p_correct: float,
                     noise: str = "systematic") -> str:
    """The canonical completion of ``record`` with probability ``p_correct``, else a plausible
    wrong one chosen with ``rng`` from ``Task.wrong_answers(record, noise)`` (arithmetic:
    ``"systematic"`` = one too many, ``"near"`` = off by one either way, ``"spread"`` = off by
    +-1, +-10 or a swap of the last two digits)."""
    task = get_task(record.columns.get("task", ""))
    if rng.random() < p_correct:
        return task.completion(str(record.columns["answer"]))
    return task.completion(rng.choice(task.wrong_answers(record, noise)))


def check(completion: Any, answer: Any) -> bool:
    """Module-level alias of :meth:`Task.check` (last integer of ``completion`` == ``answer``)."""
    return Task.check(completion, answer)


register_task(ArithmeticTask("add", "+", operator.add))
register_task(ArithmeticTask("sub", "-", operator.sub))
register_task(ArithmeticTask("mul", "*", operator.mul, default_max_operand=20))
