"""The ``math`` reward (math-verify): GSM8K- and MATH-style answers, malformed completions, the
helper process that bounds sympy's time, registration and the reward worker."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import pytest

from grpo_dist.config import RewardConfig
from grpo_dist.reward import RewardWorker, build_reward_fns, builtin_names, get_reward_fn
from grpo_dist.reward.math_answer import extract_math_answer, math_reward
from grpo_dist.reward.math_helper import HELPER

# A real GSM8K training row (question and answer as the hub has them).
GSM8K_QUESTION = ("Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in "
                  "May. How many clips did Natalia sell altogether in April and May?")
GSM8K_SOLUTION = ("Natalia sold 48/2 = <<48/2=24>>24 clips in May.\n"
                  "Natalia sold 48+24 = <<48+24=72>>72 clips altogether in April and May.\n#### 72")

# (completion, reference answer, expected reward)
CASES = [
    # GSM8K style: the reference is the full solution or the extracted "####" number
    ("In May she sold 24, so 48 + 24 = 72.\n#### 72", GSM8K_SOLUTION, 1.0),
    ("She sold 48 + 24 = 72 clips in total.", GSM8K_SOLUTION, 1.0),           # last number
    ("48 + 24 = 72, so the answer is \\boxed{72}.", "72", 1.0),
    ("So she earned $1,234 in total.\n#### $1,234", "1234", 1.0),              # thousands separator, dollars
    ("#### 18.", "18", 1.0),
    ("The answer is 71 clips.", GSM8K_SOLUTION, 0.0),
    ("#### 72\nWait, I made a mistake: 48 + 24 = 73", "72", 1.0),             # the marked answer wins
    ("She sold 72 clips. <answer>72</answer>", "72", 1.0),
    # MATH style: LaTeX in \boxed, fractions, radicals, symbolic equivalence
    ("Thus $x = \\boxed{\\frac{1}{2}}$.", "0.5", 1.0),
    ("The probability is \\boxed{\\dfrac{14}{3}}", "\\frac{14}{3}", 1.0),
    ("\\boxed{\\frac{2}{4}}", "\\frac12", 1.0),
    ("We get \\boxed{3\\sqrt{2}}.", "\\sqrt{18}", 1.0),
    ("\\boxed{x^2+2x+1}", "(x+1)^2", 1.0),
    ("\\boxed{\\frac{\\pi}{2}}", "The angle is $\\boxed{\\pi/2}$ radians.", 1.0),  # a MATH solution as reference
    ("\\boxed{(1,2)}", "(1, 2)", 1.0),
    ("\\boxed{\\frac{1}{3}}", "\\frac{1}{2}", 0.0),
    ("\\boxed{x^2-1}", "(x+1)^2", 0.0),
    ("\\boxed{\\sqrt{3}}", "1.732", 0.0),
    # nested braces inside \boxed
    ("\\boxed{\\frac{\\sqrt{3}}{2}}", "\\frac{\\sqrt{3}}{2}", 1.0),
]


@pytest.mark.parametrize("completion, reference, expected", CASES, ids=[c[0][:40] for c in CASES])
def test_math_reward_on_real_style_answers(completion, reference, expected):
    assert math_reward(["q"], [completion], answer=[reference]) == [expected]


MALFORMED = [None, "", "   ", "\\boxed{", "\\boxed{}", "####", "<answer></answer>", "x" * 100_000,
             "\ud800\udfff junk \x00", "{{{{{{", "\\boxed{9^{9^{9^{9}}}}", "12 / 0", 12, ["not", "text"]]


def test_malformed_completions_score_zero_and_never_raise():
    out = math_reward(["q"] * len(MALFORMED), MALFORMED, answer=["3"] * len(MALFORMED))
    assert out == [0.0] * len(MALFORMED)
    # a missing or empty reference scores 0, never raises
    assert math_reward(["q", "q"], ["#### 3", "#### 3"], answer=[None, ""]) == [0.0, 0.0]


def test_conversational_completion_and_numeric_reference():
    comp = [{"role": "assistant", "content": "so the total is \\boxed{72}"}]
    assert math_reward(["q"], [comp], answer=[72]) == [1.0]
    assert math_reward(["q"], ["#### 0.75"], answer=[0.75]) == [1.0]


def test_extraction_order():
    assert extract_math_answer("a \\boxed{1} then \\boxed{\\frac{2}{3}} end") == ("\\frac{2}{3}", True)
    assert extract_math_answer(GSM8K_SOLUTION) == ("72", True)
    assert extract_math_answer("<answer>5</answer> and later 7") == ("5", True)
    assert extract_math_answer("no marker, 5 then 7") == ("no marker, 5 then 7", False)
    assert extract_math_answer("\\boxed{unclosed") == ("\\boxed{unclosed", False)
    assert extract_math_answer("") is None and extract_math_answer(None) is None


def test_works_from_a_thread_like_the_reward_worker():
    """math-verify's own timeouts need the main thread; the helper process makes the reward
    usable from the reward worker's threads."""
    box = {}
    t = threading.Thread(target=lambda: box.setdefault("v", math_reward(
        ["q", "q"], ["\\boxed{\\frac{1}{2}}", "#### 7"], answer=["0.5", "8"])))
    t.start()
    t.join(60)
    assert box["v"] == [1.0, 0.0]


class _StuckOnceHelper(type(HELPER)):
    """Fault injection: the first helper answers its first comparison, then hangs on the next the
    way sympy does on some inputs; the helpers after it are the real one."""
    STUCK = ("import sys, time\n"
             "for i, _ in enumerate(sys.stdin):\n"
             "    if i:\n"
             "        time.sleep(3600)\n"
             "    sys.stdout.write('{\"ok\": true}\\n'); sys.stdout.flush()\n")

    def _start(self):
        if self.restarts == 0 and (self.proc is None or self.proc.poll() is not None):
            self.proc = subprocess.Popen([sys.executable, "-c", self.STUCK], stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE, bufsize=0)
            self.buf = b""
            return self.proc
        return super()._start()


def test_a_stuck_comparison_is_killed_and_the_helper_replaced():
    helper = _StuckOnceHelper()
    try:
        assert helper.equal("$3$", "$3$", 5.0)  # warm
        t0 = time.monotonic()
        # no time left beyond the 1 s grace: the stuck helper is killed, the answer is False
        assert helper.equal("$3$", "$3$", 0.0) is False
        assert helper.restarts == 1 and time.monotonic() - t0 < 10
        assert helper.equal("$\\frac{1}{2}$", "$0.5$", 5.0)  # a fresh (real) helper answers
        assert helper.restarts == 1
    finally:
        helper.close()


def test_an_exponent_tower_is_a_wrong_answer_in_bounded_time():
    """sympy cannot finish 9^(9^(9^9)): the helper's own timeouts or the kill end it either way."""
    t0 = time.monotonic()
    assert HELPER.equal("$3$", "$9^{9^{9^{9}}}$", 0.0) is False
    assert time.monotonic() - t0 < 10
    assert HELPER.equal("$\\frac{1}{2}$", "$0.5$", 5.0)


def test_registered_like_the_other_builtins():
    assert "math" in builtin_names()
    assert get_reward_fn("math") is math_reward
    [nr] = build_reward_fns([{"fn": "math", "kwargs": {"timeout_s": 2}}])
    assert nr.name == "math"
    with pytest.raises(ValueError, match="timeout_s"):
        build_reward_fns([{"fn": "math", "kwargs": {"timeout_s": 0}}])
    with pytest.raises(ValueError, match="unknown option"):
        build_reward_fns([{"fn": "math", "kwargs": {"mode": "exact"}}])
    with pytest.raises(ValueError, match="answer"):
        math_reward(["q"], ["#### 1"])


def test_reward_worker_scores_with_math_and_format():
    worker = RewardWorker(RewardConfig(functions=[{"fn": "math"}, {"fn": "format", "weight": 0.5}]))
    comps = ["<think>48/2=24, 48+24=72</think><answer>72</answer>", "<think>hmm</think><answer>70</answer>",
             "#### 72"]
    res = worker.score(["q"] * 3, comps, {"answer": ["72", "72", GSM8K_SOLUTION]})
    assert res.per_function["math"] == [1.0, 0.0, 1.0]
    assert res.errors == {"math": 0, "format": 0}
    assert res.total == [1.5, 0.5, 1.0]


# form="number": (completion, reference, reward with form "number"); the default form scores each 1.0
NUMBER_FORM_CASES = [
    ("\\boxed{29}", "29", 1.0),
    ("14 + 15 = 29, so \\boxed{29 cards}.", "29", 1.0),          # unit words after the number
    ("\\boxed{\\$1,234}", "1234", 1.0),                           # dollar sign, thousands separator
    ("\\boxed{\\text{29}}", "29", 1.0),
    ("\\boxed{\\frac{1}{2}}", "0.5", 1.0),                        # a fraction in lowest terms is a value
    ("\\boxed{-3.5}", "-7/2", 1.0),
    ("#### 72", "72", 1.0),
    ("She has 14 + 15 = 29 pencils.", "29", 1.0),                 # unmarked: the last number
    ("14 + 15 makes 29.", "29", 1.0),                             # ... before a sentence's full stop
    ("It costs 2.5.", "2.5", 1.0),
    ("In all 1,234.", "1234", 1.0),
    ("\\boxed{14 + 15}", "29", 0.0),                              # an expression equal to the answer
    ("\\boxed{3 \\times 4}", "12", 0.0),
    ("\\boxed{14/2}", "7", 0.0),                                  # a share left undivided
    ("\\boxed{\\frac{14}{2}}", "7", 0.0),
    ("Tom has 14 + 15 pencils.", "29", 0.0),                      # unmarked: 15 is the last number
]


@pytest.mark.parametrize("completion,reference,expected", NUMBER_FORM_CASES)
def test_number_form_wants_the_value_written_out(completion, reference, expected):
    assert math_reward(["q"], [completion], answer=[reference], form="number") == [expected]
    assert math_reward(["q"], [completion], answer=[reference]) == [1.0]


def test_number_form_malformed_and_bad_option():
    out = math_reward(["q"] * len(MALFORMED), MALFORMED, answer=["3"] * len(MALFORMED), form="number")
    assert out == [0.0] * len(MALFORMED)
    with pytest.raises(ValueError, match="form must be one of"):
        math_reward(["q"], ["\\boxed{3}"], answer=["3"], form="value")
