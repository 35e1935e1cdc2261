"""The held-out sets phrased another way (grpo_dist/data/ood_tasks.py): deterministic, answers
right, numbers beyond the training range, and no sentence the training generators could write."""

from __future__ import annotations

import random
import re
from collections import Counter

import pytest

from grpo_dist.data import env_tasks, get_task, load_prompts, make_task, ood_tasks, word_problems

_SENT = re.compile(r"(?<=[.?!])\s+")


def _skeleton_fn(names: list[str], items: list[str]):
    words = sorted(set(names) | set(items) | {"he", "she", "He", "She", "his", "her", "His", "Her"}, key=len,
                   reverse=True)
    pat = re.compile(r"\b(" + "|".join(map(re.escape, words)) + r")\b")

    def skeleton(sentence: str) -> str:
        """A sentence with every number, name, item and pronoun of either generator blanked out."""
        return pat.sub("_", re.sub(r"[0-9]+", "#", sentence))

    return skeleton


NAMES = [n for n, _ in word_problems.NAMES] + [n for n, _ in ood_tasks.NAMES] + env_tasks._NAMES + ood_tasks.TOOL_NAMES
ITEMS = word_problems.ITEMS + ood_tasks.ITEMS
skeleton = _skeleton_fn(NAMES, ITEMS)


def _sentences(texts) -> set[str]:
    return {skeleton(s) for t in texts for s in _SENT.split(t.strip()) if s}


def _training_sentences() -> set[str]:
    """Every sentence template of the training generators (each branch drawn many times)."""
    rng, texts = random.Random(0), []
    for level, fns in word_problems.LEVELS.items():
        for fn in fns:
            texts += [fn(rng, word_problems.MAX[level])[0] for _ in range(400)]
    texts += [env_tasks._problem(rng)[0] for _ in range(3000)]
    texts += [word_problems.INSTRUCTION, *word_problems.VARIED_INSTRUCTIONS]  # instruction=varied trains on these
    return _sentences(texts)


def test_no_ood_sentence_comes_from_a_training_template():
    train = _training_sentences()
    assert len(train) > 20  # the skeletons are templates, not one per number
    # the check itself: a held-out (in-distribution) problem is caught
    same = make_task("word_problems", 50, seed=0, split="eval", difficulty=2)
    assert all(_sentences([r.prompt]) <= train for r in same)
    for task in ("word_problems_ood", "tool_problems_ood"):
        pool = get_task(task).pool("eval")
        ood = _sentences(p for p, _, _ in pool)
        assert ood and not ood & train, (task, sorted(ood & train)[:5])
        # names and items are other ones too
        assert not any(re.search(rf"\b{n}\b", p) for p, _, _ in pool[:2000] for n in word_problems.ITEMS)


def test_ood_names_and_items_are_new():
    assert not {n for n, _ in ood_tasks.NAMES} & {n for n, _ in word_problems.NAMES}
    assert not set(ood_tasks.ITEMS) & set(word_problems.ITEMS)
    assert not set(ood_tasks.TOOL_NAMES) & set(env_tasks._NAMES)
    assert word_problems.INSTRUCTION not in ood_tasks.INSTRUCTIONS


def test_ood_sets_are_deterministic_and_eval_only():
    a = load_prompts("builtin:word_problems_ood?n=64&split=eval")
    b = load_prompts("builtin:word_problems_ood?n=64&split=eval")
    assert [r.prompt for r in a] == [r.prompt for r in b]
    assert [r.prompt for r in load_prompts("builtin:word_problems_ood?n=64&split=eval&seed=1")] != [r.prompt for r in a]
    assert len({r.prompt for r in a}) == 64
    for task in ("word_problems_ood", "tool_problems_ood"):
        with pytest.raises(ValueError, match="evaluation set only"):
            make_task(task, 4, split="train")


def _solve(text: str) -> int:
    """The answer of a problem, read back from its text by the template's own arithmetic."""
    n = [int(x) for x in re.findall(r"[0-9]+", text)]
    if re.search(r"lent out|jar holds|climb aboard|pumpkins", text):
        return n[0] + n[1]
    if re.search(r"bought|handed out|leaked|flew off", text):
        return n[0] - n[1]
    if re.search(r"evenly|divides|equal parts|equal length", text):
        return n[0] // n[1]
    return n[0] * n[1]


def test_word_problems_ood_answers_mix_and_range():
    recs = make_task("word_problems_ood", 512, seed=0, split="eval")
    for r in recs:
        assert _solve(r.prompt) == int(r.columns["answer"]), r.prompt
        assert "\\boxed{" in r.prompt  # the math reward's format, asked for in several wordings
    kinds = Counter(r.columns["kind"] for r in recs)
    assert set(kinds) == {"add", "sub", "mul", "div"}
    assert 0.4 < (kinds["add"] + kinds["sub"]) / len(recs) < 0.6
    assert len({r.columns["instruction"] for r in recs}) == len(ood_tasks.INSTRUCTIONS)
    top = word_problems.MAX[1]  # the training recipe's difficulty 1
    beyond = sum(max(int(x) for x in re.findall(r"[0-9]+", r.prompt)) > top for r in recs)
    assert beyond > 0.8 * len(recs)


def test_tool_problems_ood_answers_and_range():
    recs = make_task("tool_problems_ood", 300, seed=0, split="eval")
    for r in recs:
        n = [int(x) for x in re.findall(r"[0-9]+", r.prompt)]
        want = {"mul": lambda: n[0] * n[1], "add_sub": lambda: n[0] + n[1] - n[2],
                "mul_sub": lambda: n[0] * n[1] - n[2], "div": lambda: n[0] // n[1],
                "mul_add": lambda: n[0] * n[1] + n[2], "change": lambda: n[2] - n[0] * n[1]}[r.columns["kind"]]()
        assert want == int(r.columns["answer"]) and want > 0, r.prompt
        assert r.columns["question"] == r.prompt  # the calculator environment reads the question column
    train = make_task("tool_problems", 4000, seed=0)
    top = max(int(x) for r in train for x in re.findall(r"[0-9]+", r.prompt) + [r.columns["answer"]])
    beyond = sum(max(int(x) for x in re.findall(r"[0-9]+", r.prompt) + [r.columns["answer"]]) > top for r in recs)
    assert beyond > 0.5 * len(recs), (beyond, top)


def test_word_problems_mix_levels_and_vary_the_instruction_without_touching_the_held_out_split():
    """``difficulty=1-3`` is the three levels' pools together (each level's held-out problems stay
    held out); ``instruction=varied`` gives each problem one of four wordings, fixed by its text."""
    load_prompts("builtin:word_problems?n=1")  # registers the task (sources imports it on first use)
    task = get_task("word_problems")
    mixed = task.pool("train", difficulty="1-3", instruction="varied")
    plain = [p for d in (1, 2, 3) for p in task.pool("train", difficulty=d)]
    assert [(a, m) for _, a, m in mixed] == [(a, m) for _, a, m in plain]

    def split(prompt):  # (the problem, its instruction)
        said = next(i for i in word_problems.VARIED_INSTRUCTIONS if prompt.endswith(" " + i))
        return prompt[: -len(said) - 1], said

    assert [split(p)[0] for p, _, _ in mixed] == [split(p)[0] for p, _, _ in plain]
    said = Counter(split(p)[1] for p, _, _ in mixed)
    assert len(said) == 4 and min(said.values()) > len(mixed) / 8, said
    assert task.pool("train", difficulty="1-3", instruction="varied") == mixed  # deterministic
    held = {split(p)[0] for p, _, _ in task.pool("eval", difficulty="1-3")}
    assert held and not held & {split(p)[0] for p, _, _ in mixed}
    for bad in ("0-2", "3-1", "x", "1-9"):
        with pytest.raises(ValueError, match="difficulty must be one of"):
            task.pool("train", difficulty=bad)

