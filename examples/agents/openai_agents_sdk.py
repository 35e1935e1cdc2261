"""The calculator agent in the OpenAI Agents SDK (``openai-agents``): an ``Agent`` with a
``function_tool``, run by ``Runner``, trained unchanged. Two models, as the SDK's docs set them:

* ``solve`` (``rollout.agent: examples/agents/openai_agents_sdk.py:solve``): the SDK's default,
  ``OpenAIResponsesModel`` (``POST /responses``: instructions, input items, function tools; each
  turn sends the whole history as input items);
* ``solve_chat``: ``OpenAIChatCompletionsModel`` (``POST /chat/completions``).

Only the client's ``base_url`` is grpo_dist's. The input starts with the calculator's worked
conversation (a user message, a ``function_call``, its ``function_call_output``, the answer). The SDK exports traces to OpenAI by default:
``RunConfig(tracing_disabled=True)`` turns that off here (or ``OPENAI_AGENTS_DISABLE_TRACING=1``).
Reward: 1.0 for a right final answer; a run past ``max_turns`` scores 0.
"""

from __future__ import annotations

import sys
from pathlib import Path

from agents import (Agent, MaxTurnsExceeded, ModelBehaviorError, OpenAIChatCompletionsModel, OpenAIResponsesModel,
                    RunConfig, Runner, function_tool)
from openai import AsyncOpenAI

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # examples/: the calculator's prompt and tool
from calculator_agent import EXAMPLE, SYSTEM, calculate, is_right  # noqa: E402


@function_tool
def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression.

    Args:
        expression: Numbers with + - * / and parentheses, e.g. "12 * (3 + 4)".
    """
    return calculate(expression)


def _example() -> list[dict]:
    """The worked conversation of the few-shot prompt, as input items (a small model needs the call shown)."""
    user, call, result, final = EXAMPLE
    c = call["tool_calls"][0]
    return [{"role": "user", "content": user["content"]},
            {"type": "function_call", "call_id": c["id"], "name": "calculator", "arguments": c["function"]["arguments"]},
            {"type": "function_call_output", "call_id": c["id"], "output": result["content"]},
            {"role": "assistant", "content": final["content"]}]


def _run(model, row: dict, max_calls: int) -> float:
    agent = Agent(name="calculator", instructions=SYSTEM, tools=[calculator], model=model)
    question = str(row.get("question") or row["prompt"]) + " Use the calculator."
    try:
        result = Runner.run_sync(agent, [*_example(), {"role": "user", "content": question}], max_turns=max_calls,
                                 run_config=RunConfig(tracing_disabled=True))
    except (MaxTurnsExceeded, ModelBehaviorError):  # out of turns; or an answer cut at the run's max_tokens
        return 0.0  # (the SDK raises on a Responses answer whose status is "incomplete")
    return 1.0 if is_right(str(result.final_output), row["answer"]) else 0.0


def solve(base_url: str, row: dict, model: str = "policy", max_calls: int = 3) -> float:
    """``max_calls``: the Runner's ``max_turns`` (one model call each)."""
    client = AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=3600)
    return _run(OpenAIResponsesModel(model=model, openai_client=client), row, max_calls)


def solve_chat(base_url: str, row: dict, model: str = "policy", max_calls: int = 3) -> float:
    client = AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=3600)
    return _run(OpenAIChatCompletionsModel(model=model, openai_client=client), row, max_calls)
