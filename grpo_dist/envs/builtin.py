"""Built-in environments (``rollout.env: <name>``), for the built-in tasks of grpo_dist/data/env_tasks.py.

* ``calculator``: arithmetic word problems (``builtin:tool_problems``) with a ``calculator``
  tool (a safe evaluator of + - * / // % ** and parentheses, no ``eval``); reward 1 for a final
  answer whose last number is the ``answer`` column;
* ``python_code``: the same problems with a ``python`` tool that runs code in the sandbox
  (grpo_dist/envs/sandbox.py; ``env_kwargs``: cpu_s, memory_mb, output_bytes);
* ``guess_number``: no tools; the model guesses, the environment answers "Higher." / "Lower."
  until it is right (reward 1) or the turns run out (``builtin:guess_number``);
* ``tools``: :class:`~grpo_dist.envs.tools.ToolEnv` with ``env_kwargs: {tools: ['module:function']}``.

Their rewards reach the reward functions as the ``env_reward`` column: score it with
``fn: grpo_dist.envs.rewards:env_reward``.
"""

from __future__ import annotations

import ast
import math
import operator
import re
from typing import Any

from grpo_dist.envs.base import EnvLimits, EnvStep, register_env
from grpo_dist.envs.sandbox import SandboxLimits, isolation, refusal, run_python

from grpo_dist.envs.tools import ToolEnv

ALLOWS = ("unix_sockets", "network", "host_processes", "host_files")  # PythonCodeEnv(allow=...)

_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
        ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow}
_UNARY = {ast.USub: operator.neg, ast.UAdd: operator.pos}
_INT = re.compile(r"-?\d+")


def evaluate(expression: str) -> float | int:
    """The value of an arithmetic expression; ValueError for anything else (names, calls, huge powers)."""
    try:
        tree = ast.parse(expression.strip().replace("^", "**").replace("×", "*").replace("÷", "/"), mode="eval")
    except SyntaxError as e:
        raise ValueError(f"not an arithmetic expression: {e.msg}") from None

    def ev(node: ast.AST):
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.Constant) and type(node.value) in (int, float):
            return node.value
        if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
            return _UNARY[type(node.op)](ev(node.operand))
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            left, right = ev(node.left), ev(node.right)
            if isinstance(node.op, ast.Pow) and (abs(right) > 64 or abs(left) > 1e6):
                raise ValueError("power too large")
            return _OPS[type(node.op)](left, right)
        raise ValueError(f"unsupported element {type(node).__name__} (numbers, + - * / // % ** and parentheses only)")

    value = ev(tree)
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError("the result is not a finite number")
    return value


def format_number(x: float | int) -> str:
    if isinstance(x, float) and x.is_integer() and abs(x) < 1e15:
        return str(int(x))
    return str(x) if isinstance(x, int) else f"{x:.10g}"


def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression.

    Args:
        expression: Numbers with + - * / // % ** and parentheses, for example "12 * (3 + 4)".

    Returns:
        The value of the expression.
    """
    return format_number(evaluate(expression))


CALCULATOR_PROMPT = ("Solve the word problem. For arithmetic, call the calculator tool. When you know the result, "
                     "reply with the final answer as a number.")
CODE_PROMPT = ("Solve the word problem. You can run Python code with the python tool (print what you need). When you "
               "know the result, reply with the final answer as a number.")


# few_shot: a short statement of the call format and one worked conversation. SmolLM2-135M-Instruct makes
# almost no well-formed calls under the schema prompt and most of its first turns call the tool under this one
# with the question's " Use the calculator." (the probe's figures are in benchmarks/NOTES.md).
_CALL = '<tool_call>\n{{"name": "calculator", "arguments": {{"expression": "{}"}}}}\n</tool_call>'
FEW_SHOT_PROMPT = ("You can use a calculator. To use it, reply with only:\n" + _CALL.format("<expression>")
                   + "\nThe result comes back in the next message. Then give the final answer.")
FEW_SHOT_EXAMPLE = [
    {"role": "user", "content": "A baker makes 23 trays of 17 rolls and 45 more rolls. How many rolls does the baker "
                                "make? Use the calculator."},
    {"role": "assistant", "content": _CALL.format("23 * 17 + 45")},
    {"role": "tool", "name": "calculator", "content": "436"},
    {"role": "assistant", "content": "The baker makes 436 rolls."},
]


@register_env("calculator")
class CalculatorEnv(ToolEnv):
    """``few_shot``: for small models that have not learned tool calls (``FEW_SHOT_PROMPT``, one
    worked example, " Use the calculator." after each question); otherwise the schema statement."""

    def __init__(self, system_prompt: str | None = CALCULATOR_PROMPT, few_shot: bool = False, **kwargs: Any):
        if few_shot:
            kwargs = {"examples": FEW_SHOT_EXAMPLE, "question_suffix": " Use the calculator.", "state_tools": False,
                      **kwargs}
            system_prompt = FEW_SHOT_PROMPT if system_prompt == CALCULATOR_PROMPT else system_prompt
        super().__init__([calculator], system_prompt=system_prompt, **kwargs)


@register_env("python_code")
class PythonCodeEnv(ToolEnv):
    def __init__(self, system_prompt: str | None = CODE_PROMPT, cpu_s: int = 5, memory_mb: int = 512,
                 output_bytes: int = 4096, limits: EnvLimits | None = None, allow: tuple[str, ...] = (),
                 **kwargs: Any):
        """``allow``: exposures the sandbox may accept where this machine lacks the walls against them
        (``unix_sockets``, ``network``, ``host_processes``, ``host_files``; docs/security.md). Where it
        would refuse to run code, making the environment fails (pre-flight: one line, before any actor)."""
        lim = limits or EnvLimits()
        unknown = set(allow) - set(ALLOWS)
        if unknown:
            raise ValueError(f"allow: unknown {sorted(unknown)}; one of {list(ALLOWS)}")
        self.sandbox = SandboxLimits(cpu_s=cpu_s, memory_mb=memory_mb, output_bytes=output_bytes,
                                     wall_s=lim.tool_timeout_s or 30.0, **{f"allow_{a}": True for a in allow})
        why = refusal(isolation(), self.sandbox)
        if why:  # every call would answer this refusal: the run would train on it
            raise ValueError(re.sub(r"Set SandboxLimits\(allow_(\w+)=True\)", r"Set rollout.env_kwargs {allow: [\1]}",
                                    why))
        super().__init__([self.python], system_prompt=system_prompt, limits=lim, **kwargs)

    async def python(self, code: str) -> str:
        """Run a Python program in a sandbox and return what it prints.

        Args:
            code: The program's source; print the values you need.

        Returns:
            Its standard output and standard error.
        """
        return (await run_python(code, self.sandbox)).text()


@register_env("guess_number")
class GuessNumberEnv:
    """Guess the ``answer`` column; "Higher." / "Lower." after each wrong guess."""

    def __init__(self, question_column: str = "question", limits: EnvLimits | None = None):
        self.question_column = question_column
        self.target: int | None = None
        self.guesses: list[int] = []

    def reset(self, record: Any) -> list[dict[str, Any]]:
        self.target, self.guesses = int(record.columns["answer"]), []
        return [{"role": "user", "content": str(record.columns.get(self.question_column) or record.prompt)}]

    def step(self, completion: str) -> EnvStep:
        found = _INT.findall(completion)
        if not found:
            return EnvStep([{"role": "user", "content": "Reply with one whole number."}], info={"invalid": 1})
        guess = int(found[-1])
        self.guesses.append(guess)
        if guess == self.target:
            return EnvStep(reward=1.0, done=True)
        return EnvStep([{"role": "user", "content": "Higher." if self.target > guess else "Lower."}])
