"""What the agent endpoint sends back, in OpenAI's wire format: a whole answer, or the same answer
as server-sent events (``stream: true``), with the behaviour log-probs the trainer records when
the request asks for them (``logprobs``).

The engine samples a call whole (the trajectory's tokens do not depend on how they are sent), so
a streamed answer is the recorded one cut into chunks: the role, the content token by token (the
text each token adds), each tool call's id and name then its arguments in pieces, the finish
reason, the usage when ``stream_options.include_usage`` asks, then ``[DONE]``.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

ARG_PIECE = 16  # characters of a tool call's arguments per streamed chunk


@dataclass
class Answer:
    """One sampled call, as the endpoint answers it."""

    chat: bool  # /chat/completions (else /completions)
    model: str
    prompt: list[int]
    ids: list[int]
    logprobs: list[float]  # the behaviour log-probs of ``ids``
    finish: str
    decode: Callable[[list[int]], str]  # token ids -> text, as the content is decoded
    message: dict[str, Any] | None = None  # chat: the assistant message
    text: str = ""  # completions: the text
    want_logprobs: int | None = None  # None: not asked; k >= 0: asked, with k alternatives
    id: str = ""
    created: int = field(default_factory=lambda: int(time.time()))

    def __post_init__(self):
        if not self.id:
            self.id = f"{'chatcmpl' if self.chat else 'cmpl'}-{uuid.uuid4().hex}"

    @property
    def object(self) -> str:
        return "chat.completion" if self.chat else "text_completion"

    def usage(self) -> dict[str, int]:
        n_prompt, n_out = len(self.prompt), len(self.ids)
        return {"prompt_tokens": n_prompt, "completion_tokens": n_out, "total_tokens": n_prompt + n_out}

    def pieces(self) -> list[str]:
        """The text each sampled token adds to the decoded content (the last piece takes what a
        multi-byte character completes)."""
        out, before = [], ""
        for i in range(len(self.ids)):
            now = self.decode(self.ids[:i + 1])
            out.append(now[len(before):] if now.startswith(before) else now)
            before = now if now.startswith(before) else before + out[-1]
        return out


def logprobs_of(a: Answer, lo: int = 0, hi: int | None = None) -> dict[str, Any] | None:
    """OpenAI's ``logprobs`` of tokens ``lo:hi``: each token's text and behaviour log-prob. The
    alternatives (``top_logprobs`` k > 0) hold the sampled token only: the engine records no other."""
    if a.want_logprobs is None:
        return None
    hi = len(a.ids) if hi is None else hi
    toks = [a.decode([t]) for t in a.ids[lo:hi]]
    lps = a.logprobs[lo:hi]
    if a.chat:
        def entry(t, lp):
            return {"token": t, "logprob": lp, "bytes": list(t.encode("utf-8"))}

        return {"content": [{**entry(t, lp), "top_logprobs": [entry(t, lp)] if a.want_logprobs else []}
                            for t, lp in zip(toks, lps)]}
    offsets, at = [], len(a.decode(a.ids[:lo])) if lo else 0
    for t in toks:
        offsets.append(at)
        at += len(t)
    return {"tokens": toks, "token_logprobs": lps, "text_offset": offsets,
            "top_logprobs": [{t: lp} for t, lp in zip(toks, lps)] if a.want_logprobs else None}


def body(a: Answer) -> dict[str, Any]:
    """The whole answer; as vLLM's ``return_token_ids``, with the prompt's and the sample's token ids."""
    choice = {"message": a.message} if a.chat else {"text": a.text}
    return {"id": a.id, "object": a.object, "created": a.created, "model": a.model, "prompt_token_ids": list(a.prompt),
            "choices": [{"index": 0, **choice, "finish_reason": a.finish, "logprobs": logprobs_of(a),
                         "token_ids": list(a.ids)}],
            "usage": a.usage()}


def chunks(a: Answer, include_usage: bool = False) -> Iterator[dict[str, Any]]:
    """The answer as stream chunks (``chat.completion.chunk`` or ``text_completion``)."""
    obj = "chat.completion.chunk" if a.chat else "text_completion"
    head = {"id": a.id, "object": obj, "created": a.created, "model": a.model}

    def chunk(choice: dict[str, Any], finish: str | None = None, **extra) -> dict[str, Any]:
        return {**head, **extra, "choices": [{"index": 0, **choice, "logprobs": choice.pop("logprobs", None),
                                              "finish_reason": finish}]}

    calls = (a.message or {}).get("tool_calls") or []
    if a.chat:
        yield chunk({"delta": {"role": "assistant", "content": ""}}, prompt_token_ids=list(a.prompt))
    if calls:  # the content before the calls at once, then each call
        content = (a.message or {}).get("content")
        if content:
            yield chunk({"delta": {"content": content}})
        for k, c in enumerate(calls):
            fn = c["function"]
            yield chunk({"delta": {"tool_calls": [{"index": k, "id": c["id"], "type": "function",
                                                   "function": {"name": fn["name"], "arguments": ""}}]},
                         "logprobs": logprobs_of(a) if k == 0 else None})
            args = fn["arguments"]
            for i in range(0, len(args), ARG_PIECE):
                yield chunk({"delta": {"tool_calls": [{"index": k, "function": {"arguments": args[i:i + ARG_PIECE]}}]}})
    else:
        for i, piece in enumerate(a.pieces()):
            key = {"delta": {"content": piece}} if a.chat else {"text": piece}
            yield chunk({**key, "logprobs": logprobs_of(a, i, i + 1)})
    last = chunk({"delta": {}} if a.chat else {"text": ""}, a.finish)
    last["choices"][0]["token_ids"] = list(a.ids)
    yield last
    if include_usage:
        yield {**head, "choices": [], "usage": a.usage()}


def sse(events: Iterator[dict[str, Any]]) -> Iterator[bytes]:
    """Server-sent events: one ``data:`` line per chunk, then ``data: [DONE]``."""
    for e in events:
        yield f"data: {json.dumps(e)}\n\n".encode()
    yield b"data: [DONE]\n\n"
