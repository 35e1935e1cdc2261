"""The calculator agent in LangChain: ``ChatOpenAI`` with ``bind_tools``, the tool loop of
LangChain's tool-calling docs, trained unchanged (``rollout.agent: examples/agents/langchain_agent.py:solve``).

Only the ``base_url`` is grpo_dist's: ``ChatOpenAI(base_url=base_url, ...)`` sends chat
completions with ``tools``; the answers' ``tool_calls`` come back as LangChain tool calls, the
tool runs here, its ``ToolMessage`` goes back. The prompt is the calculator's few-shot one
(examples/calculator_agent.py). Reward: 1.0 for a right final answer.
"""

from __future__ import annotations

import sys
from pathlib import Path

from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # examples/: the calculator's prompt and tool
from calculator_agent import EXAMPLE, SYSTEM, calculate, is_right  # noqa: E402


@tool
def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression: numbers with + - * / and parentheses, e.g. "12 * (3 + 4)"."""
    return calculate(expression)


calculator.handle_validation_error = True  # arguments that do not validate: the error goes back as the tool's output


def _example() -> list:
    """The worked conversation of the few-shot prompt, as LangChain messages."""
    user, call, result, final = EXAMPLE
    c = call["tool_calls"][0]
    return [HumanMessage(user["content"]),
            AIMessage("", tool_calls=[{"name": "calculator", "args": {"expression": "23 * 17 + 45"}, "id": c["id"]}]),
            ToolMessage(result["content"], tool_call_id=c["id"]), AIMessage(final["content"])]


def solve(base_url: str, row: dict, model: str = "policy", max_calls: int = 3) -> float:
    llm = ChatOpenAI(model=model, base_url=base_url, api_key="unused", max_retries=0, timeout=3600)
    agent = llm.bind_tools([calculator])
    question = str(row.get("question") or row["prompt"]) + " Use the calculator."
    messages = [SystemMessage(SYSTEM), *_example(), HumanMessage(question)]
    for _ in range(max_calls):
        ai = agent.invoke(messages)
        messages.append(ai)
        if not ai.tool_calls:
            return 1.0 if is_right(ai.content, row["answer"]) else 0.0
        for call in ai.tool_calls:
            messages.append(calculator.invoke(call))  # a ToolMessage with the call's id
    return 0.0
