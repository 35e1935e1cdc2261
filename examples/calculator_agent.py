"""The calculator task as an ordinary openai-SDK tool-calling agent, trained unchanged.

Train it with ``rollout.agent: examples/calculator_agent.py:solve`` (configs/calculator_agent_smollm2.yaml):
the rollout worker calls ``solve(base_url, row)`` once per trajectory with an OpenAI-compatible
endpoint of its own; this file knows nothing of grpo_dist. Outside training, point it at any
OpenAI-compatible server (``python examples/calculator_agent.py http://127.0.0.1:8000/v1 model``).

The prompt is the built-in ``calculator`` environment's few-shot one (grpo_dist/envs/builtin.py,
``env_kwargs: {few_shot: true}``): a system prompt that states the call format, one worked
conversation, the question with " Use the calculator.". The loop: ask with ``tools=``; run every
tool call the answer makes and send the results back as ``tool`` messages; an answer without a
call is the final one. The reward: 1.0 if its last number is the row's ``answer``, else 0.0.
"""

from __future__ import annotations

import ast
import json
import operator
import re
import sys

import openai

TOOLS = [{"type": "function", "function": {
    "name": "calculator", "description": "Evaluate an arithmetic expression.",
    "parameters": {"type": "object", "required": ["expression"], "properties": {
        "expression": {"type": "string", "description": 'Numbers with + - * / and parentheses, e.g. "12 * (3 + 4)".'}}}}}]

CALL = '<tool_call>\n{{"name": "calculator", "arguments": {{"expression": "{}"}}}}\n</tool_call>'
SYSTEM = ("You can use a calculator. To use it, reply with only:\n" + CALL.format("<expression>")
          + "\nThe result comes back in the next message. Then give the final answer.")
EXAMPLE = [
    {"role": "user", "content": "A baker makes 23 trays of 17 rolls and 45 more rolls. How many rolls does the baker "
                                "make? Use the calculator."},
    {"role": "assistant", "content": None, "tool_calls": [{
        "id": "call_example", "type": "function",
        "function": {"name": "calculator", "arguments": json.dumps({"expression": "23 * 17 + 45"})}}]},
    {"role": "tool", "tool_call_id": "call_example", "content": "436"},
    {"role": "assistant", "content": "The baker makes 436 rolls."},
]
_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
        ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod}
_NUM = re.compile(r"-?\d+(?:\.\d+)?")


def calculate(expression: str) -> str:
    """The value of + - * / // % over numbers and parentheses, or an error line for the model."""
    def ev(node):
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.Constant) and type(node.value) in (int, float):
            return node.value
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -ev(node.operand)
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](ev(node.left), ev(node.right))
        raise ValueError(f"unsupported element {type(node).__name__}")

    try:
        value = ev(ast.parse(str(expression).replace("×", "*").replace("÷", "/"), mode="eval"))
    except (SyntaxError, ValueError, ZeroDivisionError) as e:
        return f"Error: {e}"
    return str(int(value)) if float(value).is_integer() else f"{value:.10g}"


def is_right(text: str | None, answer) -> bool:
    found = _NUM.findall(text or "")
    return bool(found) and abs(float(found[-1]) - float(answer)) <= 1e-6


def solve(base_url: str, row: dict, model: str = "policy", max_calls: int = 3) -> float:
    """One trajectory: at most ``max_calls`` model calls; 1.0 for a right final answer."""
    # generous timeouts: on a loaded machine a call waits for the batch it is part of (the SDK's connect timeout is 5 s)
    client = openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=3600.0)
    question = str(row.get("question") or row["prompt"]) + " Use the calculator."
    messages = [{"role": "system", "content": SYSTEM}, *EXAMPLE, {"role": "user", "content": question}]
    for _ in range(max_calls):
        try:
            reply = client.chat.completions.create(model=model, messages=messages, tools=TOOLS)
        except openai.BadRequestError:  # e.g. the trajectory's token budget is spent
            return 0.0
        msg = reply.choices[0].message
        if not msg.tool_calls:
            return 1.0 if is_right(msg.content, row["answer"]) else 0.0
        messages.append(msg.model_dump(exclude_none=True))
        for call in msg.tool_calls:
            try:
                result = calculate(json.loads(call.function.arguments).get("expression", ""))
            except (json.JSONDecodeError, AttributeError):
                result = "Error: arguments must be a JSON object with an expression"
            messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
    return 0.0  # no final answer within max_calls


if __name__ == "__main__":
    url, name = sys.argv[1], sys.argv[2]
    print(solve(url, {"question": "Tom has 12 boxes of 15 pencils. How many pencils does he have?", "answer": 180},
                model=name))
