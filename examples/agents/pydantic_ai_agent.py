"""The calculator agent in pydantic-ai: an ``Agent`` over ``OpenAIChatModel`` (formerly
``OpenAIModel``) with an ``OpenAIProvider`` at the trajectory's ``base_url``, trained unchanged
(``rollout.agent: examples/agents/pydantic_ai_agent.py:solve``).

Only the provider's ``base_url`` is grpo_dist's. The conversation starts with the calculator's
system prompt and worked example (``message_history``: a small model needs the call shown). pydantic-ai sends chat completions with its tools;
a tool call's result goes back as a ``tool`` message; arguments that do not validate are sent
back as a retry prompt (trained as the agent's messages, masked). Its instrumentation
(``logfire-api``) is a no-op unless Logfire is installed and configured. Reward: 1.0 for a right
final answer; a run past its request limit scores 0.
"""

from __future__ import annotations

import sys
from pathlib import Path

from pydantic_ai import Agent
from pydantic_ai.exceptions import UnexpectedModelBehavior, UsageLimitExceeded
from pydantic_ai.messages import (ModelRequest, ModelResponse, SystemPromptPart, TextPart, ToolCallPart, ToolReturnPart,
                                  UserPromptPart)
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.openai import OpenAIProvider
from pydantic_ai.usage import UsageLimits

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # examples/: the calculator's prompt and tool
from calculator_agent import EXAMPLE, SYSTEM, calculate, is_right  # noqa: E402


def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression.

    Args:
        expression: Numbers with + - * / and parentheses, e.g. "12 * (3 + 4)".
    """
    return calculate(expression)


def _history() -> list:
    """The system prompt and the worked conversation of the few-shot prompt, as pydantic-ai messages
    (with a ``message_history``, pydantic-ai adds no system prompt of its own: it is the first part)."""
    user, call, result, final = EXAMPLE
    c = call["tool_calls"][0]
    return [ModelRequest(parts=[SystemPromptPart(SYSTEM), UserPromptPart(user["content"])]),
            ModelResponse(parts=[ToolCallPart("calculator", c["function"]["arguments"], tool_call_id=c["id"])]),
            ModelRequest(parts=[ToolReturnPart("calculator", result["content"], tool_call_id=c["id"])]),
            ModelResponse(parts=[TextPart(final["content"])])]


def solve(base_url: str, row: dict, model: str = "policy", max_calls: int = 3) -> float:
    from openai import AsyncOpenAI

    client = AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=3600)
    llm = OpenAIChatModel(model, provider=OpenAIProvider(openai_client=client))
    agent = Agent(llm, tools=[calculator])
    question = str(row.get("question") or row["prompt"]) + " Use the calculator."
    try:
        result = agent.run_sync(question, message_history=_history(), usage_limits=UsageLimits(request_limit=max_calls))
    except (UsageLimitExceeded, UnexpectedModelBehavior):  # out of calls, or out of retries
        return 0.0
    return 1.0 if is_right(result.output, row["answer"]) else 0.0
