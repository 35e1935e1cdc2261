"""The ``math`` reward: the final answer of a completion against the reference, compared
symbolically by ``math-verify`` (the library behind TRL's and open-r1's math rewards).

Extraction (here, plain regexes, applied to the completion and to the reference alike, so a
reference may be a bare answer "72", a GSM8K solution ending in "#### 72" or a MATH solution
with ``\\boxed{...}``): the last ``\\boxed{...}`` / ``\\fbox{...}`` (balanced braces), else the
text after the last ``####``, else the last closed ``<answer>...</answer>``, else the tail of the
whole text, where math-verify takes the last expression ("the answer is $\\frac{3}{4}$", or the
last number). Equivalence: math-verify's ``parse`` + ``verify`` (LaTeX and plain expressions,
fractions vs decimals, ``1,234`` = ``1234``, sets/intervals, symbolic simplification).

math-verify's own timeouts use ``signal.alarm``, which works only in a process's main thread,
and the reward worker calls functions in threads; sympy can also hang for good on inputs like
``9^{9^{9^{9}}}``. So the parsing runs in one helper process per scoring process
(:mod:`grpo_dist.reward.math_helper`, started on first use): each completion gets
``timeout_s`` seconds, past which the helper is killed (by its handle), the completion scores
0.0 and a fresh helper takes the next one. Malformed completions score 0.0 and never raise.
"""

from __future__ import annotations

import math
import re
from typing import Any, Sequence

from grpo_dist.reward.builtin import completion_text
from grpo_dist.reward.math_helper import HELPER
from grpo_dist.reward.registry import register_reward

__all__ = ["extract_math_answer", "last_boxed", "math_reward", "number_literal"]

# Only the tail of a long completion is searched when no marker is found (the answer comes last).
TAIL_CHARS = 4000
_BOX_RE = re.compile(r"\\(?:boxed|fbox)\s*\{")
_ANSWER_RE = re.compile(r"<answer>((?:(?!</?answer>).)*)</answer>", re.DOTALL)


def last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` whose braces balance, else None."""
    for m in reversed(list(_BOX_RE.finditer(text))):
        depth, i = 1, m.end()
        while i < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        if depth == 0:
            return text[m.end():i - 1]
    return None


def extract_math_answer(text: Any) -> tuple[str, bool] | None:
    """``(candidate, is_marked)``: the final-answer text of ``text`` and whether a marker
    (``\\boxed``, ``####``, ``<answer>``) delimited it; None for an empty text. An unmarked
    candidate is the text's tail, in which math-verify looks for the last expression."""
    text = completion_text(text)
    if not text.strip():
        return None
    boxed = last_boxed(text)
    if boxed is not None:
        return boxed.strip(), True
    pos = text.rfind("####")
    if pos >= 0:
        line = text[pos + 4:].strip().split("\n", 1)[0].strip()
        if line:
            return line, True
    tags = _ANSWER_RE.findall(text)
    if tags and tags[-1].strip():
        return tags[-1].strip(), True
    return text[-TAIL_CHARS:], False


def _parse_input(candidate: tuple[str, bool], reference: bool = False) -> str:
    """The string handed to math-verify's ``parse``. A marked candidate, or a short reference
    without ``$`` (a bare answer such as ``(x+1)^2``), is the answer itself: currency dollars and
    a final period dropped, between ``$`` when it holds LaTeX or an expression. Other unmarked
    text goes as it is (math-verify takes its last expression), between ``$`` when it holds LaTeX
    commands but no math delimiters."""
    s, marked = candidate
    if not marked and reference and "$" not in s and len(s) <= 200:
        marked = True
    if not marked:
        if "\\" in s and "$" not in s and "\\(" not in s and "\\[" not in s:
            return "$" + s.strip() + "$"
        return s
    s = s.replace("\\$", "").strip().rstrip(".").strip()
    if re.search(r"[\\^{}()\[\]]", s):
        return "$" + s.replace("$", "") + "$"
    return s.replace("$", "")


# ----------------------------------------------------------------------------- the reward

_MISSING: Any = object()


# ``form="number"``: the final answer must be a value written out, not an expression equal to it.
FORMS = ("any", "number")
_DECIMAL_RE = re.compile(r"-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?")
_FRACTION_RE = re.compile(r"(-?)(?:\\[dt]?frac\{(\d+)\}\{(\d+)\}|(\d+)/(\d+))")
_WRAPPER_RE = re.compile(r"\\(?:text|textbf|mathrm|mathbf)\{([^{}]*)\}")
_UNIT_RE = re.compile(r"(?:\s*(?:\\[,;! ]|~))*\s*[A-Za-z][A-Za-z ]*$")  # "29 cards", "5\, dollars"
_NUMBER_TAIL_RE = re.compile(r"-?(?:\d{1,3}(?:,\d{3})+(?!\d)|\d+)(?:\.\d+)?(?!\.?\d)")  # "29." ends a sentence


def number_literal(candidate: tuple[str, bool]) -> str | None:
    """The answer of ``form="number"``: a marked answer holding one number written out (an integer,
    a decimal, or a fraction in lowest terms; ``$``, ``\\text{}`` wrappers, a leading dollar sign
    and trailing unit words dropped), else None; for unmarked text, its last number. ``14 + 15``,
    ``3 \\times 4`` and ``14/2`` are expressions, not values: None."""
    s, marked = candidate
    if not marked:
        nums = _NUMBER_TAIL_RE.findall(s)
        return nums[-1] if nums else None
    s = _WRAPPER_RE.sub(lambda m: m.group(1), s).replace("\\$", "").replace("$", "").strip().rstrip(".").strip()
    s = _UNIT_RE.sub("", s).strip()
    if _DECIMAL_RE.fullmatch(s):
        return s
    m = _FRACTION_RE.fullmatch(s.replace(" ", ""))
    if m:
        p, q = int(m.group(2) or m.group(4)), int(m.group(3) or m.group(5))
        if q > 1 and math.gcd(p, q) == 1:
            return f"{m.group(1)}{p}/{q}"
    return None


def _check_math(timeout_s: float = 5.0, form: str = "any") -> None:
    if form not in FORMS:
        raise ValueError(f"form must be one of {FORMS}, got {form!r}")
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) or not 0 < timeout_s < math.inf:
        raise ValueError(f"timeout_s must be a finite number > 0, got {timeout_s!r}")
    import importlib.util

    if importlib.util.find_spec("math_verify") is None:
        raise ValueError("the math reward needs the math-verify package (pip install math-verify==0.9.0)")


@register_reward("math", validate=_check_math, columns=("answer",))
def math_reward(prompts: Sequence[Any], completions: Sequence[Any], answer: Any = _MISSING,
                timeout_s: float = 5.0, form: str = "any", **kwargs: Any) -> list[float]:
    """1.0 if the completion's final answer is mathematically equal to the ``answer`` column's,
    else 0.0 (see the module doc for the extraction). ``timeout_s``: seconds per completion
    before it counts as wrong. ``form="number"``: the answer must be a value written out
    (:func:`number_literal`): ``\\boxed{14 + 15}`` scores 0.0 against 29 where ``"any"`` (the
    default, like TRL's math reward) scores it 1.0. No prediction or no reference scores 0.0."""
    _check_math(timeout_s, form)
    if answer is _MISSING:
        raise ValueError("math needs an 'answer' dataset column")
    refs = list(answer) if isinstance(answer, (list, tuple)) else [answer] * len(completions)
    if len(refs) != len(completions):
        raise ValueError(f"column 'answer' has {len(refs)} values for {len(completions)} completions")
    out = []
    for completion, ref in zip(completions, refs):
        gold = extract_math_answer(ref if isinstance(ref, str) or ref is None else str(ref))
        pred = extract_math_answer(completion)
        if pred is not None and form == "number":
            value = number_literal(pred)
            pred = None if value is None else (value, True)
        if gold is None or pred is None:
            out.append(0.0)
            continue
        ok = HELPER.equal(_parse_input(gold, reference=True), _parse_input(pred), float(timeout_s))
        out.append(1.0 if ok else 0.0)
    return out

