"""The builtin reward families: correctness, format, length, pattern, composite.

Each has TRL's signature ``fn(prompts, completions, **dataset_columns) -> list[float]``: options
are keyword arguments (bound from the config's ``kwargs``), dataset columns arrive as lists (one
value per completion) and unknown ones are ignored. A completion may be a string or a
conversational list of ``{"role", "content"}`` messages (the last message's content is scored).

Malformed completions (None, empty, unclosed or nested tags, unicode junk, 100k characters) get a
low reward and never raise. Bad *configuration* (missing ``answer`` column, a bad option value)
raises ``ValueError``; the reward worker turns that into ``failure_reward`` plus a warning.
"""

from __future__ import annotations

import functools
import math
import re
from typing import Any, Sequence

from grpo_dist.reward.registry import call_reward, check_options, get_reward_fn, register_reward

__all__ = ["completion_text", "composite_reward", "correctness_reward", "extract_answer",
           "format_reward", "length_reward", "pattern_reward"]


# ----------------------------------------------------------------------------- helpers

def completion_text(completion: Any) -> str:
    """The text of one completion: a string, or the last message's ``content`` of a
    conversational completion (content given as a list of ``{"type": "text", "text"}`` parts is
    joined). Anything else (None, numbers, odd objects) becomes ``""`` or ``str(x)``; never raises."""
    try:
        if isinstance(completion, str):
            return completion
        if completion is None:
            return ""
        if isinstance(completion, (list, tuple)):
            return completion_text(completion[-1]) if completion else ""
        if isinstance(completion, dict):
            content = completion.get("content")
            if isinstance(content, (list, tuple)):  # multimodal-style content parts
                return "".join(p.get("text", "") if isinstance(p, dict) else completion_text(p)
                               for p in content)
            return completion_text(content)
        return str(completion)
    except Exception:
        return ""


def _per_item(values: Any, n: int, column: str) -> list[Any]:
    """A dataset column as a list of ``n`` values (a scalar is broadcast)."""
    if isinstance(values, (list, tuple)):
        if len(values) != n:
            raise ValueError(f"column {column!r} has {len(values)} values for {n} completions")
        return list(values)
    return [values] * n


# Numbers: optional minus, thousands-separated or plain integer part (or a bare ".5"), optional
# decimals, exponent and "/denominator". The thousands form must not run into more digits.
_NUM_RE = re.compile(
    r"-?(?:(?:\d{1,3}(?:,\d{3})+(?!\d)|\d+)(?:\.\d+)?|(?<![\d.])\.\d+)(?:[eE][-+]?\d+)?(?:/\d+(?![\d.]))?")
_PLAIN_RE = re.compile(r"[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?")
_FLOAT_RE = re.compile(r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?")


def extract_answer(text: Any) -> str | None:
    """The predicted answer: the content of the last ``<answer>...</answer>`` (innermost for
    nested tags), else the last number in the text, else None."""
    text = completion_text(text)
    start = text.rfind("<answer>", 0, max(text.rfind("</answer>"), 0))
    if start >= 0:  # the last <answer> that is closed, up to its first closing tag
        return text[start + len("<answer>"):text.find("</answer>", start)]
    nums = _NUM_RE.findall(text)
    return nums[-1] if nums else None


def _canon(s: str) -> str:
    """Exact-mode canonical form: stripped; a plain decimal literal loses thousands separators,
    a leading '+' and leading zeros ("+01,000" -> "1000", "-0" -> "0"). "5.0" stays "5.0"."""
    s = s.strip()
    if not _PLAIN_RE.fullmatch(s):
        return s
    s = s.replace(",", "").lstrip("+")
    neg = s.startswith("-")
    body = s[1:] if neg else s
    whole, dot, frac = body.partition(".")
    whole = whole.lstrip("0") or "0"
    body = whole + dot + frac
    return "-" + body if neg and body.strip("0.") else body


def _to_float(s: str) -> float | None:
    """A finite float from a number literal ("1,234.5", "-3/4", "1e3"), else None."""
    s = re.sub(r"(?<=\d),(?=\d{3}(?!\d))", "", s.strip())  # thousands separators
    try:
        if "/" in s:
            num, _, den = s.partition("/")
            if not (_FLOAT_RE.fullmatch(num.strip()) and _FLOAT_RE.fullmatch(den.strip())):
                return None
            d = float(den)
            value = float(num) / d if d != 0 else math.nan
        elif _FLOAT_RE.fullmatch(s):
            value = float(s)
        else:
            return None
    except (ValueError, OverflowError):
        return None
    return value if math.isfinite(value) else None


def _parse_number(s: str) -> float | None:
    """``s`` as a number; if ``s`` is not a bare number, its last number (e.g. "x = 5")."""
    value = _to_float(s)
    if value is None:
        nums = _NUM_RE.findall(s)
        value = _to_float(nums[-1]) if nums else None
    return value


def _reference(answer: Any) -> str | None:
    if answer is None or isinstance(answer, bool):
        return None if answer is None else str(answer)
    if isinstance(answer, float):
        if not math.isfinite(answer):
            return None
        return str(int(answer)) if answer.is_integer() else repr(answer)
    return str(answer)


# ----------------------------------------------------------------------------- correctness

_MISSING: Any = object()


def _check_correctness(mode: str = "exact", tol: float = 1e-6) -> None:
    if mode not in ("exact", "numeric"):
        raise ValueError(f"mode must be 'exact' or 'numeric', got {mode!r}")
    if not isinstance(tol, (int, float)) or not tol >= 0 or not math.isfinite(tol):
        raise ValueError(f"tol must be a finite number >= 0, got {tol!r}")


@register_reward("correctness", validate=_check_correctness, columns=("answer",))
def correctness_reward(prompts: Sequence[Any], completions: Sequence[Any], answer: Any = _MISSING,
                       mode: str = "exact", tol: float = 1e-6, **kwargs: Any) -> list[float]:
    """1.0 if the predicted answer (:func:`extract_answer`) matches the ``answer`` column, else 0.0.

    ``mode="exact"``: canonical strings are equal (stripped; plain numbers compared without
    thousands separators, '+' or leading zeros, so "1,000" == "1000" but "5.0" != "5"; an integral
    float reference such as 5.0 reads "5"). ``mode="numeric"``: both sides parse as finite numbers
    (decimals, exponents, simple fractions "3/4"; an ``<answer>`` holding text uses its last number)
    and ``abs(pred - ref) <= tol``. No prediction or no reference scores 0.0.
    """
    _check_correctness(mode, tol)
    if answer is _MISSING:
        raise ValueError("correctness needs an 'answer' dataset column")
    refs = _per_item(answer, len(completions), "answer")
    out = []
    for completion, ref in zip(completions, refs):
        try:
            pred, want = extract_answer(completion), _reference(ref)
            if pred is None or want is None:
                ok = False
            elif mode == "exact":
                ok = _canon(pred) == _canon(want)
            else:
                a, b = _parse_number(pred), _to_float(want)
                ok = a is not None and b is not None and abs(a - b) <= tol
        except Exception:  # malformed input is simply wrong
            ok = False
        out.append(1.0 if ok else 0.0)
    return out


# ----------------------------------------------------------------------------- format

_TAGS = ("<think>", "</think>", "<answer>", "</answer>")
_BODY = r"((?:(?!</?think>|</?answer>).)*)"  # a block body holds no think/answer tag
_BLOCK = rf"<think>{_BODY}</think>\s*<answer>{_BODY}</answer>"
_STRICT_RE = re.compile(rf"\s*{_BLOCK}\s*", re.DOTALL)
_LOOSE_RE = re.compile(_BLOCK, re.DOTALL)


def _check_format(strict: bool = True) -> None:
    if not isinstance(strict, bool):
        raise ValueError(f"strict must be true or false, got {strict!r}")


@register_reward("format", validate=_check_format)
def format_reward(prompts: Sequence[Any], completions: Sequence[Any], strict: bool = True,
                  **kwargs: Any) -> list[float]:
    """1.0 for ``<think>...</think><answer>...</answer>`` (whitespace allowed between the blocks;
    bodies may not contain these tags). ``strict``: the whole completion, up to surrounding
    whitespace; else the block may appear anywhere.

    Otherwise partial credit, at most 0.8: 0.2 for each of ``<think>``, ``</think>``, ``<answer>``,
    ``</answer>`` (in that order) that occurs exactly once and after every earlier tag that
    scored. E.g. ``"<answer>5</answer>"`` 0.4, an unclosed ``<answer>`` after a think block 0.6.
    """
    _check_format(strict)
    regex = _STRICT_RE.fullmatch if strict else _LOOSE_RE.search
    out = []
    for completion in completions:
        text = completion_text(completion)
        try:
            if regex(text):
                out.append(1.0)
                continue
            score, last = 0.0, -1
            for tag in _TAGS:
                pos = text.find(tag)
                if pos > last and text.find(tag, pos + 1) < 0:
                    score, last = score + 0.2, pos
            out.append(round(score, 10))
        except Exception:
            out.append(0.0)
    return out


# ----------------------------------------------------------------------------- length

_UNITS = ("chars", "words", "tokens")


def _check_length(min_len: float = 0, max_len: float = 256, unit: str = "chars",
                  tokenizer: Any = None) -> None:
    for key, v in (("min_len", min_len), ("max_len", max_len)):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise ValueError(f"{key} must be a finite number, got {v!r}")
    if not 0 <= min_len <= max_len or max_len <= 0:
        raise ValueError(f"need 0 <= min_len <= max_len and max_len > 0, got {min_len}, {max_len}")
    if unit not in _UNITS:
        raise ValueError(f"unit must be one of {_UNITS}, got {unit!r}")
    if isinstance(tokenizer, str):
        _load_tokenizer(tokenizer)


@functools.lru_cache(maxsize=4)
def _load_tokenizer(path: str) -> Any:
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(path)
    except Exception as e:
        raise ValueError(f"cannot load tokenizer {path!r}: {e}") from e


def _count_tokens(tokenizer: Any, text: str) -> int:
    tok = _load_tokenizer(tokenizer) if isinstance(tokenizer, str) else tokenizer
    if hasattr(tok, "encode"):
        try:
            return len(tok.encode(text, add_special_tokens=False))
        except TypeError:
            return len(tok.encode(text))
    return len(tok(text))


@register_reward("length", validate=_check_length)
def length_reward(prompts: Sequence[Any], completions: Sequence[Any], min_len: float = 0,
                  max_len: float = 256, unit: str = "chars", tokenizer: Any = None,
                  **kwargs: Any) -> list[float]:
    """1.0 for a length L in ``[min_len, max_len]``; below, ``L / min_len`` (0 at empty); above,
    ``(2 * max_len - L) / max_len`` clipped at 0 (0 from twice ``max_len`` on).

    ``unit``: ``chars``, ``words`` (whitespace-separated) or ``tokens`` — the ``completion_ids``
    column when the caller passes one (TRL does), else ``tokenizer`` (a path for
    ``AutoTokenizer`` or an object with ``encode``).
    """
    _check_length(min_len, max_len, unit, None)
    n = len(completions)
    ids = kwargs.get("completion_ids")
    if unit == "tokens" and ids is None and tokenizer is None:
        raise ValueError("unit='tokens' needs a 'completion_ids' column or a 'tokenizer' option")
    ids = _per_item(ids, n, "completion_ids") if unit == "tokens" and ids is not None else None
    out = []
    for i, completion in enumerate(completions):
        text = completion_text(completion)
        if unit == "chars":
            size = len(text)
        elif unit == "words":
            size = len(text.split())
        elif ids is not None:
            size = len(ids[i]) if ids[i] is not None else 0
        else:
            size = _count_tokens(tokenizer, text)
        if size < min_len:
            out.append(size / min_len)
        elif size <= max_len:
            out.append(1.0)
        else:
            out.append(max(0.0, (2 * max_len - size) / max_len))
    return out


# ----------------------------------------------------------------------------- pattern

_MODES = ("any", "all", "fraction")


def _as_list(x: Any) -> list[str]:
    if x is None:
        return []
    return [x] if isinstance(x, str) else list(x)


def _compile(regex: Any, keywords: Any, case_sensitive: bool) -> list[re.Pattern]:
    flags = 0 if case_sensitive else re.IGNORECASE
    pats = []
    for r in _as_list(regex):
        if not isinstance(r, str):
            raise ValueError(f"regex must be a string or a list of strings, got {r!r}")
        try:
            pats.append(re.compile(r, flags | re.DOTALL))
        except re.error as e:
            raise ValueError(f"bad regex {r!r}: {e}") from None
    for k in _as_list(keywords):
        if not isinstance(k, str) or not k:
            raise ValueError(f"keywords must be non-empty strings, got {k!r}")
        pats.append(re.compile(re.escape(k), flags))
    if not pats:
        raise ValueError("pattern needs 'regex' and/or 'keywords'")
    return pats


def _check_pattern(regex: Any = None, keywords: Any = None, mode: str = "any",
                   case_sensitive: bool = False) -> None:
    if mode not in _MODES:
        raise ValueError(f"mode must be one of {_MODES}, got {mode!r}")
    _compile(regex, keywords, case_sensitive)


@register_reward("pattern", validate=_check_pattern)
def pattern_reward(prompts: Sequence[Any], completions: Sequence[Any], regex: Any = None,
                   keywords: Any = None, mode: str = "any", case_sensitive: bool = False,
                   **kwargs: Any) -> list[float]:
    """Presence of patterns: each ``regex`` (a string or list, ``re.search``) and each keyword
    (plain substring) is one check. ``mode="any"``: 1.0 if any check hits; ``"all"``: 1.0 if all
    do; ``"fraction"``: the share that hit. Case-insensitive unless ``case_sensitive``."""
    _check_pattern(regex, keywords, mode, case_sensitive)
    pats = _compile(regex, keywords, case_sensitive)
    out = []
    for completion in completions:
        text = completion_text(completion)
        hits = sum(1 for p in pats if p.search(text))
        if mode == "any":
            out.append(1.0 if hits else 0.0)
        elif mode == "all":
            out.append(1.0 if hits == len(pats) else 0.0)
        else:
            out.append(hits / len(pats))
    return out


# ----------------------------------------------------------------------------- composite

def composite_components(components: Any) -> list[tuple[str, Any, float, dict]]:
    if not isinstance(components, (list, tuple)) or not components:
        raise ValueError("components must be a non-empty list of {fn, weight, kwargs}")
    out = []
    for c in components:
        if not isinstance(c, dict) or "fn" not in c:
            raise ValueError(f"each component needs an 'fn', got {c!r}")
        extra = set(c) - {"fn", "weight", "kwargs", "name"}
        if extra:
            raise ValueError(f"component {c['fn']!r}: unknown key(s) {sorted(extra)}")
        weight = c.get("weight", 1.0)
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not math.isfinite(weight):
            raise ValueError(f"component {c['fn']!r}: weight must be a finite number, got {weight!r}")
        out.append((c["fn"], get_reward_fn(c["fn"]), float(weight), dict(c.get("kwargs") or {})))
    return out


_COMBINE = ("sum", "product")


def _check_composite(components: Any = None, combine: str = "sum") -> None:
    if combine not in _COMBINE:
        raise ValueError(f"combine must be one of {_COMBINE}, got {combine!r}")
    for spec, fn, _, options in composite_components(components):
        check_options(spec, fn, options)


@register_reward("composite", validate=_check_composite)
def composite_reward(prompts: Sequence[Any], completions: Sequence[Any], components: Any = None,
                     combine: str = "sum", **columns: Any) -> list[float]:
    """``sum_c weight_c * fn_c(prompts, completions, **columns, **kwargs_c)`` over ``components``
    (``[{"fn": spec, "weight": w, "kwargs": {...}}, ...]``; specs resolve like the config's ``fn``,
    so builtins, plug-ins and nested composites work). ``combine="product"``: the product of the
    weighted values instead, an AND of 0/1 rewards (a format bonus paid only with a correct answer:
    ``[{fn: math}, {fn: pattern, ...}]``). A component's None entries (TRL's "not applicable") add 0
    (multiply by 1); a failing component makes the composite fail; NaN propagates."""
    _check_composite(components, combine)
    n = len(completions)
    total = [0.0 if combine == "sum" else 1.0] * n
    for spec, fn, weight, options in composite_components(components):
        values = call_reward(fn, prompts, completions, options, columns)
        if values is None or isinstance(values, (str, bytes, dict)) or len(values) != n:
            got = len(values) if hasattr(values, "__len__") else type(values).__name__
            raise ValueError(f"component {spec!r} returned {got} values for {n} completions")
        for i, v in enumerate(values):
            if v is not None:
                total[i] = total[i] + weight * float(v) if combine == "sum" else total[i] * weight * float(v)
    return total
