"""The calculator agent with the openai SDK's ``stream=True``: the tool loop of
examples/calculator_agent.py, its answers read as server-sent chunks (content deltas, tool-call
deltas by ``index``), as OpenAI's streaming docs accumulate them; trained unchanged
(``rollout.agent: examples/agents/openai_stream.py:solve``). The tokens trained are the same as
without streaming: the endpoint samples a call whole and cuts the recorded answer into chunks.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import openai

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # examples/: the calculator's prompt and tool
from calculator_agent import EXAMPLE, SYSTEM, TOOLS, calculate, is_right  # noqa: E402


def _streamed(client, **request) -> tuple[str, list[dict]]:
    """One streamed answer: its content and its tool calls, put together from the chunks."""
    content, calls = "", {}
    for chunk in client.chat.completions.create(stream=True, **request):
        for choice in chunk.choices:
            content += choice.delta.content or ""
            for d in choice.delta.tool_calls or []:
                c = calls.setdefault(d.index, {"id": "", "type": "function", "function": {"name": "", "arguments": ""}})
                c["id"] = d.id or c["id"]
                if d.function:
                    c["function"]["name"] += d.function.name or ""
                    c["function"]["arguments"] += d.function.arguments or ""
    return content, [calls[k] for k in sorted(calls)]


def solve(base_url: str, row: dict, model: str = "policy", max_calls: int = 3) -> float:
    client = openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=3600.0)
    question = str(row.get("question") or row["prompt"]) + " Use the calculator."
    messages = [{"role": "system", "content": SYSTEM}, *EXAMPLE, {"role": "user", "content": question}]
    for _ in range(max_calls):
        try:
            content, calls = _streamed(client, model=model, messages=messages, tools=TOOLS)
        except openai.BadRequestError:  # e.g. the trajectory's token budget is spent
            return 0.0
        if not calls:
            return 1.0 if is_right(content, row["answer"]) else 0.0
        messages.append({"role": "assistant", "content": content or None, "tool_calls": calls})
        for call in calls:
            try:
                result = calculate(json.loads(call["function"]["arguments"]).get("expression", ""))
            except (json.JSONDecodeError, AttributeError):
                result = "Error: arguments must be a JSON object with an expression"
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": result})
    return 0.0
