"""Builtin reward families: hand-computed values, malformed completions, conversational input."""

from __future__ import annotations

import math

import pytest

from grpo_dist.reward import (
    completion_text,
    composite_reward,
    correctness_reward,
    extract_answer,
    format_reward,
    get_reward_fn,
    length_reward,
    pattern_reward,
)

GOOD = "<think>2+2 is 4</think><answer>4</answer>"

# Completions that must never crash any family and must not be rewarded as correct / well formed.
WEIRD = [
    "",
    None,
    "x" * 100_000,
    "\udcff\u202e\x00 🤖 ∑∫ \ufffd" * 50,
    "<think>unclosed",
    "<answer>",
    "</answer></answer><answer>",
    "<think><think>nested</think></think><answer><answer>",
    "1e3",
    "no number at all",
    12345,
    [],
    [{"role": "assistant"}],
    {"content": None},
    object(),
]


def _all_builtins_on(completions, answer):
    n = len(completions)
    prompts = ["q"] * n
    return {
        "correctness_exact": correctness_reward(prompts, completions, answer=[answer] * n),
        "correctness_numeric": correctness_reward(prompts, completions, answer=[answer] * n, mode="numeric"),
        "format_strict": format_reward(prompts, completions),
        "format_loose": format_reward(prompts, completions, strict=False),
        "length": length_reward(prompts, completions, min_len=10, max_len=20),
        "pattern": pattern_reward(prompts, completions, keywords=["because", "therefore"], mode="fraction"),
    }


# ----------------------------------------------------------------------------- helpers

def test_completion_text_forms():
    conv = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "the end"}]
    assert completion_text(conv) == "the end"
    assert completion_text([{"role": "assistant", "content": [{"type": "text", "text": "a"},
                                                              {"type": "text", "text": "b"}]}]) == "ab"
    assert completion_text(None) == "" and completion_text([]) == ""
    assert completion_text(7) == "7"


@pytest.mark.parametrize("text,want", [
    ("so the result is 1,234,567.", "1,234,567"),
    ("x = -42", "-42"),
    ("3.25 then 0.5", "0.5"),
    ("1e3", "1e3"),
    ("a 3/4 b", "3/4"),
    ("5 - 3 = 2 <answer> 7 </answer> trailing 9", " 7 "),
    ("<answer><answer>5</answer></answer>", "5"),  # nested: innermost of the last pair
    ("<answer>6", "6"),  # unclosed: falls back to the last number
    ("no digits here", None),
    ("", None),
])
def test_extract_answer(text, want):
    assert extract_answer(text) == want


# ----------------------------------------------------------------------------- correctness

def test_correctness_exact_hand_values():
    completions = ["46", "the answer is 46.", "<answer>46</answer> and then 12", "<answer>47</answer> 46",
                   "45", "<answer>1,000</answer>", "1,000", "0046", "46.0", ""]
    answers = ["46", 46, "46", "46", 46, "1000", 1000, 46, 46, 46]
    assert correctness_reward([""] * 10, completions, answer=answers) == [
        1.0, 1.0, 1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 0.0, 0.0]


def test_correctness_exact_strings_and_float_reference():
    comps = ["<answer> Paris </answer>", "<answer>paris</answer>", "5", "<answer>x = 5</answer>", "-0"]
    assert correctness_reward(None, comps, answer=["Paris", "Paris", 5.0, "5", 0]) == [1.0, 0.0, 1.0, 0.0, 1.0]


def test_correctness_numeric_hand_values():
    comps = ["46.0", "<answer>x = 0.75</answer>", "<answer>3/4</answer>", "1e3", "-2.5", "1,234.5",
             "0.3333", "0.3333", "1e999", "<answer>1/0</answer>", "nothing"]
    answers = [46, "3/4", 0.75, "1000", -2.5, "1234.5", "1/3", "1/3", 1, 0, 0]
    got = correctness_reward(None, comps, answer=answers, mode="numeric")
    assert got == [1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0]
    loose = correctness_reward(None, comps[6:7], answer=answers[6:7], mode="numeric", tol=1e-3)
    assert loose == [1.0]


def test_correctness_exact_does_not_evaluate_numbers():
    # "1e3" and "46.0" are numerically right but not the same literal.
    assert correctness_reward(None, ["1e3", "46.0"], answer=[1000, 46]) == [0.0, 0.0]
    assert correctness_reward(None, ["1e3", "46.0"], answer=[1000, 46], mode="numeric") == [1.0, 1.0]


def test_correctness_ignores_unknown_columns_and_broadcasts_scalar():
    out = correctness_reward(["p", "p"], ["7", "8"], answer="7", task=["add", "add"], completion_ids=[[1], [2]])
    assert out == [1.0, 0.0]


def test_correctness_none_reference_and_missing_column():
    assert correctness_reward(None, ["5", "5"], answer=[None, float("nan")], mode="numeric") == [0.0, 0.0]
    with pytest.raises(ValueError, match="answer"):
        correctness_reward(None, ["5"])
    with pytest.raises(ValueError, match="2 values for 1"):
        correctness_reward(None, ["5"], answer=["5", "6"])
    with pytest.raises(ValueError, match="mode"):
        correctness_reward(None, ["5"], answer=["5"], mode="fuzzy")


def test_correctness_conversational():
    conv = [[{"role": "assistant", "content": "<think>hm</think><answer>12</answer>"}],
            [{"role": "assistant", "content": "12"}, {"role": "assistant", "content": "13"}]]
    assert correctness_reward(None, conv, answer=["12", "12"]) == [1.0, 0.0]


# ----------------------------------------------------------------------------- format

def test_format_strict_and_partial_credit():
    comps = [
        GOOD,
        "  \n<think>\nmulti\nline</think>\n\n<answer> 4 </answer>\n",
        "prefix " + GOOD,                             # all four tags in order, but junk: 0.8
        "<think>a</think><answer>5",                  # unclosed answer: 0.6
        "<answer>5</answer>",                         # no think block: 0.4
        "<think>x",                                   # 0.2
        "</think><think>",                            # wrong order: only <think> counts
        "<think><think>x</think></think><answer>5</answer>",  # duplicated think tags: 0.4
        "<answer>4</answer><think>a</think>",        # blocks swapped: 0.4
        "",
        "plain text",
    ]
    assert format_reward(None, comps) == [1.0, 1.0, 0.8, 0.6, 0.4, 0.2, 0.2, 0.4, 0.4, 0.0, 0.0]


def test_format_non_strict_finds_block_anywhere():
    comps = ["prefix " + GOOD + " suffix", "<think><think>x</think><answer>5</answer>", "<answer>5</answer>"]
    assert format_reward(None, comps, strict=False) == [1.0, 1.0, 0.4]
    assert format_reward(None, comps, strict=True) == [0.8, 0.6, 0.4]


def test_format_body_may_not_hold_tags():
    assert format_reward(None, ["<think>a<answer>b</think><answer>c</answer>"]) == [0.6]


# ----------------------------------------------------------------------------- length

def test_length_chars_hand_values():
    comps = ["", "a" * 5, "a" * 10, "a" * 15, "a" * 20, "a" * 25, "a" * 40, "a" * 100]
    assert length_reward(None, comps, min_len=10, max_len=20) == [0.0, 0.5, 1.0, 1.0, 1.0, 0.75, 0.0, 0.0]


def test_length_words_and_defaults():
    assert length_reward(None, ["one two three", "one"], min_len=2, max_len=2, unit="words") == [0.5, 0.5]
    assert length_reward(None, ["", "x" * 300, "x" * 600]) == [1.0, pytest.approx(212 / 256), 0.0]


def test_length_tokens_from_column_or_tokenizer():
    ids = [[1, 2, 3], [1] * 8]
    assert length_reward(None, ["a", "b"], max_len=4, unit="tokens", completion_ids=ids) == [1.0, 0.0]

    class Tok:
        def encode(self, text, add_special_tokens=True):
            return text.split("-")

    assert length_reward(None, ["a-b-c-d-e-f"], max_len=4, unit="tokens", tokenizer=Tok()) == [0.5]
    with pytest.raises(ValueError, match="completion_ids"):
        length_reward(None, ["a"], unit="tokens")
    with pytest.raises(ValueError, match="min_len"):
        length_reward(None, ["a"], min_len=5, max_len=2)


# ----------------------------------------------------------------------------- pattern

def test_pattern_modes_and_case():
    comps = ["Because x, THEREFORE y", "because only", "nothing here", ""]
    kw = ["because", "therefore"]
    assert pattern_reward(None, comps, keywords=kw) == [1.0, 1.0, 0.0, 0.0]
    assert pattern_reward(None, comps, keywords=kw, mode="all") == [1.0, 0.0, 0.0, 0.0]
    assert pattern_reward(None, comps, keywords=kw, mode="fraction") == [1.0, 0.5, 0.0, 0.0]
    assert pattern_reward(None, comps, keywords=kw, mode="fraction", case_sensitive=True) == [0.0, 0.5, 0.0, 0.0]


def test_pattern_regex_and_keywords_together():
    comps = ["E = mc^2 because", "a = b", "see [1] because", "no"]
    got = pattern_reward(None, comps, regex=[r"\w+\s*=\s*\w+", r"\[\d+\]"], keywords="because", mode="fraction")
    assert got == pytest.approx([2 / 3, 1 / 3, 2 / 3, 0.0])
    assert pattern_reward(None, ["a.b", "axb"], regex=r"a\.b") == [1.0, 0.0]  # regex is not escaped
    assert pattern_reward(None, ["a.b", "axb"], keywords="a.b") == [1.0, 0.0]  # keywords are literal


def test_pattern_needs_a_pattern_and_valid_regex():
    with pytest.raises(ValueError, match="regex"):
        pattern_reward(None, ["x"])
    with pytest.raises(ValueError, match="bad regex"):
        pattern_reward(None, ["x"], regex="(")


# ----------------------------------------------------------------------------- composite

def test_composite_weighted_sum_by_hand():
    comps = [GOOD, "<answer>4</answer>", "5"]
    components = [
        {"fn": "correctness", "weight": 2.0},
        {"fn": "format", "weight": 0.5},
        {"fn": "length", "weight": -1.0, "kwargs": {"max_len": 10}},
    ]
    # correctness [1, 1, 0]; format [1, 0.4, 0]; length: len 41 -> 0, len 18 -> 0.2, len 1 -> 1.
    got = composite_reward(["p"] * 3, comps, components=components, answer=["4", "4", "4"])
    assert got == pytest.approx([2.0 + 0.5, 2.0 + 0.2 - 0.2, -1.0])


def test_composite_nested_and_kwargs_win_over_columns():
    inner = {"fn": "composite", "kwargs": {"components": [{"fn": "pattern", "kwargs": {"keywords": "x"}}]}}
    # A dataset column named "mode" must not override the component's configured mode.
    comps = ["x 3", "y 3"]
    got = composite_reward(None, comps, components=[inner, {"fn": "correctness", "weight": 3,
                                                              "kwargs": {"mode": "numeric"}}],
                           answer=["3.0", "3.0"], mode=["exact", "exact"])
    assert got == [4.0, 3.0]


def test_composite_product_pays_a_format_bonus_only_with_the_right_answer():
    """combine: product: math AND a boxed number; summed with math alone, the recipe's shaping."""
    comps = ["\\boxed{9}", "9", "\\boxed{8}", "\\boxed{}"]
    both = {"fn": "composite", "kwargs": {"combine": "product", "components": [
        {"fn": "math"}, {"fn": "pattern", "kwargs": {"regex": r"\\boxed\{-?\d+\}"}}]}}
    got = composite_reward(["p"] * 4, comps, components=[{"fn": "math"}, {**both, "weight": 0.1}], answer=["9"] * 4)
    assert got == pytest.approx([1.1, 1.0, 0.0, 0.0])
    assert composite_reward(["p"], ["x"], combine="product", components=[{"fn": "length", "weight": 2.0}]) == [2.0]
    with pytest.raises(ValueError, match="combine must be one of"):
        composite_reward(["p"], ["x"], combine="max", components=[{"fn": "length"}])


def test_composite_rejects_bad_components():
    with pytest.raises(ValueError, match="non-empty"):
        composite_reward(None, ["a"], components=[])
    with pytest.raises(ValueError, match="unknown reward function"):
        composite_reward(None, ["a"], components=[{"fn": "nope"}])
    with pytest.raises(ValueError, match="weight"):
        composite_reward(None, ["a"], components=[{"fn": "format", "weight": "heavy"}])


# ----------------------------------------------------------------------------- robustness

def test_weird_completions_never_raise_and_score_low():
    scores = _all_builtins_on(WEIRD, answer="4")
    for family, values in scores.items():
        assert len(values) == len(WEIRD), family
        assert all(isinstance(v, float) and math.isfinite(v) for v in values), family
    assert scores["correctness_exact"] == [0.0] * len(WEIRD)
    assert scores["correctness_numeric"] == [0.0] * len(WEIRD)
    assert max(scores["format_strict"]) < 1.0 and max(scores["format_loose"]) < 1.0
    assert scores["pattern"] == [0.0] * len(WEIRD)
    assert scores["length"][WEIRD.index("x" * 100_000)] == 0.0
    assert scores["length"][WEIRD.index("")] == 0.0


def test_long_completion_with_answer_is_still_found():
    text = "junk " * 20_000 + GOOD
    assert correctness_reward(None, [text], answer=["4"]) == [1.0]
    assert format_reward(None, [text], strict=False) == [1.0]
    assert format_reward(None, [text]) == [0.8]


def test_builtins_resolve_by_name():
    assert get_reward_fn("correctness") is correctness_reward
    assert get_reward_fn("format") is format_reward
    assert get_reward_fn(" length ") is length_reward
    assert get_reward_fn("pattern") is pattern_reward
    assert get_reward_fn("composite") is composite_reward
