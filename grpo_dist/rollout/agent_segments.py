"""Token bookkeeping of one agent trajectory (``rollout.agent``): its segments, token in, token out.

A trajectory is what one call of the agent function sends to its endpoint. Each request either
*extends* the current segment or opens a new one:

* chat: the request's messages start with the segment's conversation so far (the messages of its
  last request plus the assistant message returned for it, compared by role, text and tool
  calls) and add messages after it, with the same tools. The prompt is then the segment's ids
  so far (prompt + every sampled turn, exactly as the engine returned them) followed by the chat
  template's tokens for the added messages (:class:`~grpo_dist.envs.chat.MessageEncoder`, mask 0);
* completions: the request's prompt ids start with the segment's ids so far.

Anything else (the agent rewrote, dropped or summarised its history, changed its tools, or
switched endpoints) starts a new segment, whose prompt is the request rendered on its own (the
chat template with the generation prompt). Nothing is decoded and encoded again: sampled ids
are kept as sampled, and only the messages the agent adds are tokenized.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from grpo_dist.envs.chat import cap_tool_messages, encode_opening, has_template, takes_tools
from grpo_dist.envs.parsers import ToolParser

ROLES = ("system", "developer", "user", "assistant", "tool")


class AgentRequestError(ValueError):
    """A request the endpoint refuses: an OpenAI-style error (``status``, ``param``, the message)."""

    def __init__(self, message: str, status: int = 400, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.status, self.param, self.code = status, param, code


def text_of(content: Any, where: str) -> str:
    """A message's content as text (a string, None, or a list of text parts)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for p in content:
            if isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str):
                parts.append(p["text"])
            else:
                kind = p.get("type") if isinstance(p, dict) else type(p).__name__
                raise AgentRequestError(f"{where}: only text content parts are supported, not {kind!r}", param=where)
        return "".join(parts)
    raise AgentRequestError(f"{where}: content must be a string or a list of text parts", param=where)


def calls_of(msg: dict[str, Any], where: str) -> list[tuple[str, dict[str, Any]]]:
    """An assistant message's tool calls as (name, arguments object)."""
    out = []
    for k, c in enumerate(msg.get("tool_calls") or []):
        fn = c.get("function") if isinstance(c, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise AgentRequestError(f"{where}.tool_calls[{k}]: needs function.name", param=f"{where}.tool_calls")
        args = fn.get("arguments") or "{}"
        try:
            args = json.loads(args) if isinstance(args, str) else args
        except json.JSONDecodeError:
            raise AgentRequestError(f"{where}.tool_calls[{k}].function.arguments is not JSON",
                                    param=f"{where}.tool_calls") from None
        out.append((fn["name"], args if isinstance(args, dict) else {"value": args}))
    return out


def normalize(messages: Any) -> list[tuple]:
    """Comparable messages: (role, text, tool calls as canonical JSON, name) each; 400 if malformed."""
    if not isinstance(messages, list) or not messages:
        raise AgentRequestError("messages must be a non-empty list", param="messages")
    out = []
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(m, dict) or m.get("role") not in ROLES:
            raise AgentRequestError(f"{where}: role must be one of {', '.join(ROLES)}", param=where)
        role = "system" if m["role"] == "developer" else m["role"]
        calls = tuple(json.dumps([n, a], sort_keys=True) for n, a in calls_of(m, where)) if role == "assistant" else ()
        out.append((role, text_of(m.get("content"), where), calls, m.get("name") if role == "tool" else None))
    return out


def template_messages(norm: list[tuple], tok: Any, schemas: list | None, parser: ToolParser | None) -> list[dict]:
    """Messages as the chat template takes them: tool calls as the template's ``tool_calls``
    where it renders tools, else written into the content in the parser's format."""
    native = bool(schemas) and takes_tools(tok, schemas)
    out = []
    for role, text, calls, name in norm:
        m: dict[str, Any] = {"role": role, "content": text}
        if calls:
            parsed = [json.loads(c) for c in calls]
            if native or parser is None:
                m["tool_calls"] = [{"type": "function", "function": {"name": n, "arguments": a}} for n, a in parsed]
            else:
                m["content"] = text + "".join(call_text(parser, n, a) for n, a in parsed)
        if name:
            m["name"] = name
        out.append(m)
    return out


def call_text(parser: ToolParser, name: str, args: dict[str, Any]) -> str:
    opener = getattr(parser, "open", "<tool_call>")
    return f"{opener}\n{json.dumps({'name': name, 'arguments': args})}\n{parser.stop[0]}"


@dataclass
class Segment:
    """One sample to train on: a prompt, then sampled ids (mask 1) and the agent's added
    messages' template tokens (mask 0)."""

    kind: str  # "chat" | "completion"
    prompt_ids: list[int]
    tools_key: str = ""
    history: list[tuple] = field(default_factory=list)  # chat: the conversation so far (normalized)
    ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    transcript: list[dict[str, Any]] = field(default_factory=list)  # the turns after the prompt, as text
    turns: int = 0

    @property
    def context(self) -> list[int]:
        return self.prompt_ids + self.ids

    def add(self, ids: list[int], logprobs: list[float] | None) -> None:
        self.ids += list(ids)
        self.logprobs += list(logprobs) if logprobs is not None else [0.0] * len(ids)
        self.mask += [1 if logprobs is not None else 0] * len(ids)


@dataclass
class Pending:
    """A request's place: its segment (new or current), the tokens it adds before sampling."""

    segment: Segment
    extra: list[int]
    said: list[dict[str, Any]]
    history: list[tuple]
    cut: int = 0

    @property
    def prompt(self) -> list[int]:
        return self.segment.context + self.extra


@dataclass
class AgentTrajectory:
    """The segments of one trajectory, in order; the last one is the conversation the rewards score."""

    tok: Any
    encoder: Any  # MessageEncoder of tok
    tool_result_cap: int | None = None
    segments: list[Segment] = field(default_factory=list)
    counters: dict[str, float] = field(default_factory=dict)

    @property
    def current(self) -> Segment | None:
        return self.segments[-1] if self.segments else None

    def count(self, key: str, n: float = 1.0) -> None:
        self.counters[key] = self.counters.get(key, 0.0) + n

    def chat_prompt(self, messages: Any, schemas: list | None, parser: ToolParser | None,
                    state_tools: bool = True) -> "Pending":
        """Where a chat request samples: the current segment extended by the added messages'
        template tokens if the request extends it, else a new segment; nothing changes until
        :meth:`record`."""
        norm = normalize(messages)
        if not has_template(self.tok):
            raise AgentRequestError("the model's tokenizer has no chat template: use /v1/completions")
        key = json.dumps(schemas or [], sort_keys=True)
        seg = self.current
        n = len(seg.history) if seg is not None else 0
        if (seg is not None and seg.kind == "chat" and seg.tools_key == key and len(norm) > n
                and norm[:n] == seg.history and norm[n][0] != "assistant"):
            added = template_messages(norm[n:], self.tok, schemas, parser)
            added, cut = cap_tool_messages(self.tok, added, self.tool_result_cap)
            extra = self.encoder(added, seg.ids[-1] if seg.ids else None)
            return Pending(seg, extra, [dict(m) for m in added], norm, cut)
        msgs = template_messages(norm, self.tok, schemas, parser)
        stated = (schemas, parser) if state_tools or takes_tools(self.tok, schemas or []) else (None, None)
        return Pending(Segment("chat", encode_opening(self.tok, msgs, *stated), key), [], [], norm)

    def completion_prompt(self, prompt_ids: list[int]) -> "Pending":
        seg = self.current
        if seg is not None and seg.kind == "completion" and seg.turns > 0 and len(prompt_ids) >= len(seg.context) \
                and prompt_ids[:len(seg.context)] == seg.context:
            extra = prompt_ids[len(seg.context):]
            said = [{"role": "user", "content": self.tok.decode(extra)}] if extra else []
            return Pending(seg, extra, said, [])
        return Pending(Segment("completion", list(prompt_ids)), [], [], [])

    def record(self, p: "Pending", token_ids: list[int], logprobs: list[float], assistant: dict[str, Any] | None,
               text: str) -> None:
        """A sampled turn: the added messages' tokens (mask 0), then its ids and behaviour
        log-probs (mask 1); chat: the assistant message returned joins the segment's conversation."""
        seg = p.segment
        if not self.segments or seg is not self.segments[-1]:
            self.segments.append(seg)
        seg.add(p.extra, None)
        seg.transcript += p.said
        self.count("tool_truncated", p.cut)
        seg.add(token_ids, logprobs)
        seg.turns += 1
        seg.transcript.append({"role": "assistant", "content": text})
        if assistant is not None:
            seg.history = p.history + normalize([assistant])

    @property
    def sampled(self) -> int:
        return sum(sum(s.mask) for s in self.segments)
