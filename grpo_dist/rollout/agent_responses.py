"""The Responses API (``POST /responses``) of the agent endpoint, as a translation to and from a
chat call: the OpenAI Agents SDK's default model calls it.

A request's ``instructions`` become a system message, ``input`` (a string, or items: messages,
``function_call`` and ``function_call_output``) the conversation, ``tools`` (function tools, flat)
the chat tools, ``tool_choice`` and ``max_output_tokens`` their chat names; ``previous_response_id``
(a response of the same trajectory) puts that response's conversation and output before the
input. The chat call samples, records and applies the segment rule as for ``/chat/completions``;
its answer becomes the response's ``output`` items (``message`` with ``output_text``, one
``function_call`` per call) and ``usage``; ``stream: true`` sends the same response as the API's
events (:func:`events`: the call is sampled whole, the text and arguments cut into deltas).
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any, Iterator

from grpo_dist.rollout.agent_segments import AgentRequestError
from grpo_dist.rollout.agent_wire import Answer


def _text(content: Any) -> Any:
    """A Responses message's content as chat content (``input_text`` / ``output_text`` parts -> text)."""
    if isinstance(content, list):
        parts = [p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") in
                 ("input_text", "output_text", "text")]
        if len(parts) != len(content):
            raise AgentRequestError("input content: only text parts (input_text, output_text) are supported",
                                    param="input")
        return "".join(parts)
    return content


def to_chat(body: dict[str, Any], history: list[dict[str, Any]]) -> dict[str, Any]:
    """The chat request of a Responses request; ``history``: the messages before its input
    (``previous_response_id``'s conversation, or none)."""
    if not isinstance(body, dict):
        raise AgentRequestError("the request body must be a JSON object")
    messages = list(history)
    if body.get("instructions") and not history:
        messages.append({"role": "system", "content": str(body["instructions"])})
    items = body.get("input")
    if isinstance(items, str):
        items = [{"role": "user", "content": items}]
    if not isinstance(items, list) or not items:
        raise AgentRequestError("input must be a string or a non-empty list of items", param="input")
    for it in items:
        kind = it.get("type", "message") if isinstance(it, dict) else None
        if kind == "message":
            messages.append({"role": it.get("role"), "content": _text(it.get("content"))})
        elif kind == "function_call":
            call = {"id": it.get("call_id"), "type": "function",
                    "function": {"name": it.get("name"), "arguments": it.get("arguments", "{}")}}
            if messages and messages[-1]["role"] == "assistant" and messages[-1].get("tool_calls") is not None:
                messages[-1]["tool_calls"].append(call)  # parallel calls: one assistant message
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            out = it.get("output")
            messages.append({"role": "tool", "tool_call_id": it.get("call_id"),
                             "content": out if isinstance(out, str) else json.dumps(out)})
        else:
            raise AgentRequestError(f"input item of type {kind!r}: message, function_call and "
                                    f"function_call_output are supported", param="input")
    chat: dict[str, Any] = {"messages": messages}
    tools = body.get("tools")
    if tools:
        if not all(isinstance(t, dict) and t.get("type") == "function" and "name" in t for t in tools):
            raise AgentRequestError("tools: only function tools ({type: function, name, parameters}) are "
                                    "supported", param="tools")
        chat["tools"] = [{"type": "function", "function": {k: t[k] for k in ("name", "description", "parameters")
                                                           if k in t}} for t in tools]
    choice = body.get("tool_choice")
    if isinstance(choice, dict) and choice.get("type") == "function":
        choice = {"type": "function", "function": {"name": choice.get("name")}}
    if choice is not None:
        chat["tool_choice"] = choice
    for src, dst in (("max_output_tokens", "max_tokens"), ("temperature", "temperature"), ("top_p", "top_p"),
                     ("parallel_tool_calls", "parallel_tool_calls")):
        if body.get(src) is not None:
            chat[dst] = body[src]
    return chat


def response(answer: Answer, body: dict[str, Any]) -> dict[str, Any]:
    """The Responses object of a chat answer."""
    msg = answer.message or {}
    output: list[dict[str, Any]] = []
    if msg.get("content"):
        output.append({"type": "message", "id": f"msg_{uuid.uuid4().hex}", "role": "assistant",
                       "status": "completed",
                       "content": [{"type": "output_text", "text": msg["content"], "annotations": []}]})
    for c in msg.get("tool_calls") or []:
        output.append({"type": "function_call", "id": f"fc_{uuid.uuid4().hex}", "call_id": c["id"],
                       "name": c["function"]["name"], "arguments": c["function"]["arguments"],
                       "status": "completed"})
    cut = answer.finish == "length"
    usage = answer.usage()
    return {"id": f"resp_{uuid.uuid4().hex}", "object": "response", "created_at": int(time.time()),
            "status": "incomplete" if cut else "completed", "model": answer.model, "output": output,
            "incomplete_details": {"reason": "max_output_tokens"} if cut else None, "error": None,
            "instructions": body.get("instructions"), "tools": body.get("tools") or [],
            "tool_choice": body.get("tool_choice", "auto"), "parallel_tool_calls": body.get("parallel_tool_calls", True),
            "max_output_tokens": body.get("max_output_tokens"), "previous_response_id": body.get("previous_response_id"),
            "text": {"format": {"type": "text"}}, "metadata": {},
            "usage": {"input_tokens": usage["prompt_tokens"], "output_tokens": usage["completion_tokens"],
                      "total_tokens": usage["total_tokens"], "input_tokens_details": {"cached_tokens": 0},
                      "output_tokens_details": {"reasoning_tokens": 0}}}


ARG_PIECE = 16  # characters of text or arguments per streamed delta


def events(resp: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """A response as the Responses API streams it (``stream: true``): created, each output item
    added, its text or arguments in deltas, done, then completed (the response, whole)."""
    seq = iter(range(1 << 30))

    def ev(kind: str, **fields) -> dict[str, Any]:
        return {"type": kind, "sequence_number": next(seq), **fields}

    yield ev("response.created", response={**resp, "status": "in_progress", "output": []})
    for i, item in enumerate(resp["output"]):
        if item["type"] == "message":
            text = item["content"][0]["text"]
            part = {"type": "output_text", "text": "", "annotations": []}
            yield ev("response.output_item.added", output_index=i,
                     item={**item, "status": "in_progress", "content": []})
            yield ev("response.content_part.added", item_id=item["id"], output_index=i, content_index=0, part=part)
            for k in range(0, len(text), ARG_PIECE):
                yield ev("response.output_text.delta", item_id=item["id"], output_index=i, content_index=0,
                         delta=text[k:k + ARG_PIECE], logprobs=[])
            yield ev("response.output_text.done", item_id=item["id"], output_index=i, content_index=0, text=text,
                     logprobs=[])
            yield ev("response.content_part.done", item_id=item["id"], output_index=i, content_index=0,
                     part={**part, "text": text})
        else:
            args = item["arguments"]
            yield ev("response.output_item.added", output_index=i,
                     item={**item, "status": "in_progress", "arguments": ""})
            for k in range(0, len(args), ARG_PIECE):
                yield ev("response.function_call_arguments.delta", item_id=item["id"], output_index=i,
                         delta=args[k:k + ARG_PIECE])
            yield ev("response.function_call_arguments.done", item_id=item["id"], output_index=i, arguments=args,
                     name=item["name"])
        yield ev("response.output_item.done", output_index=i, item=item)
    yield ev("response.incomplete" if resp["status"] == "incomplete" else "response.completed", response=resp)


def sse(evs: Iterator[dict[str, Any]]) -> Iterator[bytes]:
    """Server-sent events with their ``event:`` names (the Responses API sends no ``[DONE]``)."""
    for e in evs:
        yield f"event: {e['type']}\ndata: {json.dumps(e)}\n\n".encode()
