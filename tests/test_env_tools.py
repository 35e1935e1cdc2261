"""Tool environments without a model: the Hermes parser, plain tool functions (schemas as
transformers makes them), guarded calls (errors, timeouts, parallel-call limit), TRL-style
environment classes, the environment picked per record by a column, and the built-in
calculator and guess-the-number environments."""

from __future__ import annotations

import asyncio
import time

import pytest

from grpo_dist.envs import EnvLimits, EnvSource, make_env
from grpo_dist.envs.base import run
from grpo_dist.envs.builtin import CalculatorEnv, GuessNumberEnv, evaluate
from grpo_dist.envs.parsers import HermesParser, get_parser
from grpo_dist.envs.rewards import env_reward
from grpo_dist.envs.tools import Tool, ToolEnv, TRLEnv
from grpo_dist.types import PromptRecord


def multiply(a: int, b: int) -> int:
    """Multiply two integers.

    Args:
        a: The first factor.
        b: The second factor.

    Returns:
        The product.
    """
    return a * b


def slow(seconds: float) -> str:
    """Sleep, then answer.

    Args:
        seconds: How long to sleep.
    """
    time.sleep(seconds)
    return "slept"


async def aslow(seconds: float) -> str:
    """Sleep without blocking, then answer.

    Args:
        seconds: How long to sleep.
    """
    await asyncio.sleep(seconds)
    return "slept"


def broken(x: int) -> int:
    """Always fails.

    Args:
        x: Anything.
    """
    raise RuntimeError("disk on fire")


def call(name: str, **args) -> str:
    import json

    return f'<tool_call>\n{json.dumps({"name": name, "arguments": args})}\n</tool_call>'


def rec(i=0, **cols) -> PromptRecord:
    return PromptRecord(i, cols.pop("prompt", "What is 6 times 7?"), cols)


def test_hermes_parser_reads_calls_and_names_each_malformed_one():
    p = get_parser("hermes")
    assert isinstance(p, HermesParser) and p.stop == ["</tool_call>"]
    out = p.parse("Let me compute. " + call("multiply", a=6, b=7) + call("multiply", a=2, b=3) + " done")
    assert [(c.name, c.arguments) for c in out.calls] == [("multiply", {"a": 6, "b": 7}), ("multiply", {"a": 2, "b": 3})]
    assert out.errors == [] and out.content == "Let me compute.  done"
    # arguments given as a JSON string are accepted (some models write them so)
    assert p.parse('<tool_call>{"name": "f", "arguments": "{\\"x\\": 1}"}</tool_call>').calls[0].arguments == {"x": 1}
    bad = p.parse('<tool_call>{"name": "f", "arguments": {"x": 1}</tool_call>'  # one brace short
                  '<tool_call>["f"]</tool_call><tool_call>{"arguments": {}}</tool_call>'
                  '<tool_call>{"name": "f", "arguments": [1]}</tool_call><tool_call>{"name": "g", "argu')
    assert bad.calls == [] and len(bad.errors) == 5 and bad.attempted == 5
    assert "not valid JSON" in bad.errors[0] and "JSON object" in bad.errors[1] and '"name"' in bad.errors[2]
    assert '"arguments" must be' in bad.errors[3] and "not closed" in bad.errors[4]
    assert p.parse("The answer is 42.").attempted == 0
    assert "<tools>" in p.tools_prompt([Tool(multiply).schema]) and '"name": "multiply"' in p.tools_prompt(
        [Tool(multiply).schema])
    with pytest.raises(ValueError, match="unknown tool parser 'xml'"):
        get_parser("xml")


def test_plain_functions_are_tools_with_the_transformers_schema():
    from transformers.utils import get_json_schema

    t = Tool(multiply)
    assert t.name == "multiply" and t.schema == get_json_schema(multiply)
    assert t.schema["function"]["parameters"]["properties"]["a"] == {"type": "integer", "description": "The first factor."}
    with pytest.raises(ValueError, match="no JSON schema"):
        Tool(lambda x: x)  # no docstring, no type hints


def test_tool_env_runs_calls_and_turns_failures_into_counted_error_results():
    env = ToolEnv([multiply, slow, aslow, broken], limits=EnvLimits(tool_timeout_s=0.5, max_parallel_calls=8))
    assert env.stop == []  # several calls per turn: the model ends its turn itself
    assert [m["role"] for m in env.reset(rec(answer="42"))] == ["user"]
    text = (call("multiply", a=6, b=7) + call("nope") + call("multiply", a="x") + call("broken", x=1)
            + call("slow", seconds=3) + call("aslow", seconds=3) + "<tool_call>{oops}</tool_call>")
    t0 = time.monotonic()
    step = run(env.step(text))
    took = time.monotonic() - t0
    assert took < 2.5  # the calls ran concurrently, each cut at 0.5 s
    contents = [m["content"] for m in step.messages]
    assert [m["role"] for m in step.messages] == ["tool"] * 7 and not step.done
    assert contents[0] == "42"
    assert contents[1].startswith("Error: unknown tool 'nope'") and "multiply" in contents[1]
    assert contents[2].startswith("Error: bad arguments for multiply")  # b missing
    assert contents[3] == "Error: broken raised RuntimeError: disk on fire"
    assert contents[4] == "Error: slow timed out after 0.5 s" and contents[5] == "Error: aslow timed out after 0.5 s"
    assert contents[6].startswith("Error: tool call is not valid JSON")
    assert step.info == {"tool_calls": 7, "tool_errors": 6, "tool_timeouts": 2, "tool_malformed": 1}
    final = run(env.step("So the answer is 42."))
    assert final.done and final.reward == 1.0 and run(env.step("It is 41.")).reward == 0.0


def test_max_parallel_calls_and_the_stop_string():
    env = ToolEnv([multiply], limits=EnvLimits(max_parallel_calls=1))
    assert env.stop == ["</tool_call>"]  # one call per turn: generation stops after it
    env.reset(rec())
    step = run(env.step(call("multiply", a=2, b=3) + call("multiply", a=4, b=5)))
    assert [m["content"] for m in step.messages] == [
        "6", "Error: at most 1 tool call(s) per turn; multiply was not run"]
    assert step.info["tool_calls"] == 2 and step.info["tool_errors"] == 1


def test_tool_messages_come_in_the_order_the_calls_were_written():
    """A malformed call between two good ones, and one past max_parallel_calls: one tool message
    per call, in the order the model wrote them (it matches results to calls by position)."""
    env = ToolEnv([multiply], limits=EnvLimits(max_parallel_calls=2))
    env.reset(rec())
    text = "<tool_call>{oops}</tool_call>" + call("multiply", a=2, b=3) + call("multiply", a=4, b=5) + (
        call("multiply", a=1, b=1))
    contents = [m["content"] for m in run(env.step(text)).messages]
    assert contents[0].startswith("Error: tool call is not valid JSON") and contents[1:3] == ["6", "20"]
    assert contents[3] == "Error: at most 2 tool call(s) per turn; multiply was not run" and len(contents) == 4


class Counter:
    """A TRL-style environment: reset(**row), public methods as tools, get_reward()."""

    def reset(self, target, prompt, **kwargs):
        self.counter, self.target, self.seen = 0, target, dict(kwargs, prompt=prompt)
        return f"Reach {target}."

    def increment(self, step: int) -> int:
        """Add to the counter.

        Args:
            step: Value to add.

        Returns:
            The counter.
        """
        self.counter += step
        return self.counter

    def _private(self):
        return None

    def get_reward(self) -> float:
        return float(self.counter == self.target)


def test_trl_style_environment_class_works_unchanged(tmp_path):
    spec = tmp_path / "trl_env.py"
    spec.write_text("import sys\nsys.path.insert(0, %r)\nfrom test_env_tools import Counter\n" % str(
        __import__("pathlib").Path(__file__).parent))
    env = make_env(f"{spec}:Counter", limits=EnvLimits(max_parallel_calls=1))
    assert isinstance(env, TRLEnv) and [t["function"]["name"] for t in env.tools] == ["increment"]
    opening = run(env.reset(rec(target=5, question="Count up.")))
    assert opening == [{"role": "user", "content": "Count up.\n\nReach 5."}]
    assert env.inner.seen == {"question": "Count up.", "prompt": "What is 6 times 7?"}
    for _ in range(2):
        assert run(env.step(call("increment", step=2))).info["tool_calls"] == 1
    assert run(env.step(call("increment", step=1))).messages[0]["content"] == "5"
    done = run(env.step("Reached it."))
    assert done.done and done.reward is None  # the environment owns the reward ...
    assert run(env.finish("done")) == 1.0  # ... through get_reward at the end


def test_a_column_picks_the_environment_per_record():
    src = EnvSource("single_turn", column="env", named={"calc": {"env": "calculator", "kwargs": {"system_prompt": None}}})
    assert src.name_of(rec()) == "single_turn" and src.name_of(rec(env="guess_number")) == "guess_number"
    calc = src.make(rec(env="calc"))
    assert isinstance(calc, CalculatorEnv) and calc.system_prompt is None
    assert isinstance(src.make(rec(env="guess_number")), GuessNumberEnv)
    with pytest.raises(ValueError, match="column 'env' value 'chess': unknown environment 'chess'"):
        src.make(rec(env="chess"))


def test_calculator_evaluates_arithmetic_only():
    assert evaluate("12 * (3 + 4)") == 84 and evaluate("7/2") == 3.5 and evaluate("2^10") == 1024
    for bad, why in [("__import__('os')", "unsupported"), ("9**9**9", "power too large"), ("1/0", "division"),
                     ("2 +", "not an arithmetic")]:
        with pytest.raises((ValueError, ZeroDivisionError), match=why):
            evaluate(bad)
    env = CalculatorEnv(limits=EnvLimits())
    opening = env.reset(rec(question="Q?", answer="84"))
    assert [m["role"] for m in opening] == ["system", "user"] and opening[1]["content"] == "Q?"
    assert run(env.step(call("calculator", expression="12*(3+4)"))).messages[0]["content"] == "84"
    bad = run(env.step(call("calculator", expression="os.system('x')")))
    assert bad.messages[0]["content"].startswith("Error: calculator raised ValueError") and bad.info["tool_errors"] == 1
    assert run(env.step("The answer is 84")).reward == 1.0


def test_guess_number_feedback_and_the_env_reward_function():
    env = GuessNumberEnv()
    assert env.reset(rec(answer="37", question="Guess."))[0]["content"] == "Guess."
    assert env.step("50").messages[0]["content"] == "Lower."
    assert env.step("I say 20").messages[0]["content"] == "Higher."
    assert env.step("hmm").messages[0]["content"] == "Reply with one whole number."
    won = env.step("37")
    assert won.done and won.reward == 1.0 and env.guesses == [50, 20, 37]
    assert env_reward(["p"] * 3, ["c"] * 3, env_reward=[1.0, None, 0.5]) == [1.0, 0.0, 0.5]


def test_tool_reward_columns():
    from grpo_dist.envs.rewards import tool_call_ok, tool_errors_penalty

    kw = {"tool_calls": [0, 1, 2, 1, None], "tool_errors": [0, 0, 1, None, None]}
    assert tool_call_ok(["p"] * 5, ["c"] * 5, **kw) == [0.0, 1.0, 0.0, 1.0, 0.0]
    assert tool_errors_penalty(["p"] * 5, ["c"] * 5, **kw) == [0.0, 0.0, -1.0, 0.0, 0.0]
    assert tool_call_ok(["p"] * 2, ["c"] * 2) == [0.0, 0.0]  # a single-turn rollout has no such columns
