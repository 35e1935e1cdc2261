"""The form of a completion's final answer, as the ``math`` reward reads it: the metric that
shows a math run's reward hacks while they happen (``rollout/answer_form/<form>`` each step).

* ``box:number``: the last ``\\boxed{}`` holds a number written out (``\\boxed{29}``; what the
  ``math`` reward's ``form: number`` takes as a value);
* ``box:expr``: it holds an expression (``\\boxed{14 + 15}``: the ``math`` reward's default form
  scores it as its value);
* ``box:empty``: an empty box (``\\boxed{}``: a pattern bonus for ``\\boxed{`` pays for it);
* ``box:other``: anything else in the box;
* ``plain:result``: no box, the text ends on an equation's result (``12 + 7 = 19 stickers``);
* ``plain:expr``: no box, an expression without its result last (``Emma has 12 + 7 stickers``:
  math-verify takes the last expression, 19);
* ``plain:other``: no box, anything else.
"""

from __future__ import annotations

import re
from typing import Any, Iterable

from grpo_dist.reward.math_answer import last_boxed, number_literal

FORMS = ("box:number", "box:expr", "box:empty", "box:other", "plain:result", "plain:expr", "plain:other")
_OP = re.compile(r"\d\s*(?:[-+*/×÷x·]|\\times|\\cdot|\\div)\s*\d")
_RESULT = re.compile(r"=\s*\$?-?\d[\d,.]*\D*$")


def answer_form(text: str) -> str:
    """One of :data:`FORMS` for ``text``."""
    last = last_boxed(text)
    if last is not None:
        last = last.strip()
        if not last:
            return "box:empty"
        if number_literal((last, True)) is not None:  # math's form: number would read it as a value
            return "box:number"
        return "box:expr" if _OP.search(last) else "box:other"
    tail = text.strip().splitlines()[-1] if text.strip() else ""
    if _RESULT.search(tail):
        return "plain:result"
    return "plain:expr" if _OP.search(tail) else "plain:other"


def form_fractions(texts: Iterable[Any]) -> dict[str, float]:
    """The share of each form among ``texts`` (every form present, 0.0 where none)."""
    counts = dict.fromkeys(FORMS, 0)
    n = 0
    for t in texts:
        counts[answer_form(t if isinstance(t, str) else str(t))] += 1
        n += 1
    return {f: c / max(1, n) for f, c in counts.items()}


def checks_math(functions: Iterable[Any]) -> bool:
    """Whether the ``math`` reward is among ``functions`` (the config's reward.functions, or a
    composite's components, nested composites included)."""
    for f in functions:
        fn, kwargs = (f.get("fn"), f.get("kwargs") or {}) if isinstance(f, dict) else (f.fn, f.kwargs or {})
        if fn == "math" or (fn == "composite" and checks_math(kwargs.get("components") or [])):
            return True
    return False


def form_metrics(functions: Iterable[Any], completions: Iterable[Any]) -> dict[str, float]:
    """``rollout/answer_form/<form>``: each form's share of a step's ``completions`` where
    ``functions`` include the ``math`` reward; else none."""
    if not checks_math(functions):
        return {}
    return {f"rollout/answer_form/{k}": v for k, v in form_fractions(completions).items()}
