"""The calculator agent in smolagents: a ``ToolCallingAgent`` over ``OpenAIServerModel``, as
smolagents' docs write it, trained unchanged (``rollout.agent: examples/agents/smolagents_agent.py:solve``).

Only the ``api_base`` is grpo_dist's. smolagents sends its own system prompt (the tools, with its
``final_answer`` tool, and the ``instructions`` given here: the calculator's call format), the task,
``tool_choice: "required"`` and its ``stop`` sequences; each step's answer must be a tool call
(``calculator`` or ``final_answer``); after ``max_steps`` it asks once more, without tools, for a
final answer. A step can take 3 calls (``required``: the endpoint samples again while no call
comes), so give the trajectory room: ``rollout.max_turns`` 8 for 2 steps, and a longer context
than the plain agent (``model.max_model_len`` 4096: the system prompt alone is ~1,500 SmolLM2 tokens). smolagents sends
no telemetry unless its OpenTelemetry instrumentation is installed and started; ``verbosity_level=0``
keeps its console output off. Reward: 1.0 for a right final answer.
"""

from __future__ import annotations

import sys
from pathlib import Path

from smolagents import OpenAIServerModel, ToolCallingAgent, tool
from smolagents.utils import AgentGenerationError

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # examples/: the calculator's prompt and tool
from calculator_agent import SYSTEM, calculate, is_right  # noqa: E402


@tool
def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression.

    Args:
        expression: Numbers with + - * / and parentheses, e.g. "12 * (3 + 4)".
    """
    return calculate(expression)


def solve(base_url: str, row: dict, model: str = "policy", max_calls: int = 2) -> float:
    """``max_calls``: the agent's ``max_steps`` (a step may take 3 requests, the final ask 1 more)."""
    llm = OpenAIServerModel(model_id=model, api_base=base_url, api_key="unused", client_kwargs={"max_retries": 0,
                                                                                                "timeout": 3600})
    agent = ToolCallingAgent(tools=[calculator], model=llm, max_steps=max_calls, verbosity_level=0, instructions=SYSTEM)
    try:
        answer = agent.run(str(row.get("question") or row["prompt"]))
    except AgentGenerationError:  # a model call failed: e.g. the trajectory's calls or tokens are spent (a 400)
        return 0.0
    return 1.0 if is_right(str(answer), row["answer"]) else 0.0
