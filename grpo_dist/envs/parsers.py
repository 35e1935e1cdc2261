"""Tool-call parsers: the assistant's text of one turn -> the tool calls it makes.

A parser knows one wire format:

* ``stop``: the strings that end a call; a tool environment adds them to the turn's stop
  strings so generation stops after a call (the engine keeps them in the sampled ids and the
  text handed to the parser is decoded from those ids, so the closing tag is there);
* ``parse(text) -> ParsedTurn``: the well-formed calls, one error line per malformed one, and
  the text outside the calls;
* ``tools_prompt(schemas)``: the tool schemas stated in the format this parser reads, for a
  system prompt when the chat template takes no ``tools=`` argument.

:class:`HermesParser` reads ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` (the
format of Qwen's chat templates, after NousResearch's Hermes models). Others register with
:func:`register_parser` and are named by ``rollout.tool_parser``.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol


@dataclass
class ToolCall:
    name: str
    arguments: dict[str, Any]


@dataclass
class ParsedTurn:
    calls: list[ToolCall] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)  # one line per malformed call, for the model to read
    content: str = ""  # the text outside the calls
    items: list[ToolCall | str] = field(default_factory=list)  # calls and error lines, in the order written

    def in_order(self) -> list[ToolCall | str]:
        """Every call (a ToolCall, or its error line if malformed) in the order the model wrote
        them; a parser that fills only ``calls`` and ``errors``: the calls, then the errors."""
        return list(self.items) if self.items else [*self.calls, *self.errors]

    @property
    def attempted(self) -> int:
        """Calls the model tried to make, well-formed or not."""
        return len(self.calls) + len(self.errors)


class ToolParser(Protocol):
    name: str
    stop: list[str]

    def parse(self, text: str) -> ParsedTurn: ...

    def tools_prompt(self, schemas: list[dict[str, Any]]) -> str: ...


_PARSERS: dict[str, Callable[[], ToolParser]] = {}


def register_parser(name: str):
    def deco(cls):
        _PARSERS[name] = cls
        return cls

    return deco


def get_parser(name: str | ToolParser) -> ToolParser:
    if not isinstance(name, str):
        return name
    try:
        return _PARSERS[name]()
    except KeyError:
        raise ValueError(f"unknown tool parser {name!r} (known: {', '.join(sorted(_PARSERS))})") from None


@register_parser("hermes")
class HermesParser:
    """``<tool_call>\\n{"name": "f", "arguments": {"x": 1}}\\n</tool_call>``, several per turn allowed.

    Malformed: a body that is not a JSON object, no string ``name``, ``arguments`` that are not
    an object (a JSON string holding an object is accepted, as some models write it), or a
    ``<tool_call>`` never closed (a turn cut by its token limit)."""

    name = "hermes"
    open, close = "<tool_call>", "</tool_call>"
    stop = ["</tool_call>"]
    _CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)

    def parse(self, text: str) -> ParsedTurn:
        out = ParsedTurn()
        rest, last = [], 0
        for m in self._CALL.finditer(text):
            rest.append(text[last:m.start()])
            last = m.end()
            call, err = self._one(m.group(1))
            if call is not None:
                out.calls.append(call)
            else:
                out.errors.append(err)
            out.items.append(call if call is not None else err)
        tail = text[last:]
        if self.open in tail:  # opened, never closed
            cut = tail.index(self.open)
            out.errors.append(f"tool call not closed with {self.close}: {_short(tail[cut:])}")
            out.items.append(out.errors[-1])
            tail = tail[:cut]
        rest.append(tail)
        out.content = "".join(rest).strip()
        return out

    @staticmethod
    def _one(body: str) -> tuple[ToolCall | None, str]:
        try:
            obj = json.loads(body.strip())
        except json.JSONDecodeError as e:
            return None, f"tool call is not valid JSON ({e.msg} at char {e.pos}): {_short(body)}"
        if not isinstance(obj, dict):
            return None, f"tool call must be a JSON object with name and arguments: {_short(body)}"
        name, args = obj.get("name"), obj.get("arguments", {})
        if not isinstance(name, str) or not name:
            return None, f"tool call has no \"name\" string: {_short(body)}"
        if isinstance(args, str):
            try:
                args = json.loads(args)
            except json.JSONDecodeError:
                pass
        if not isinstance(args, dict):
            return None, f"tool call \"arguments\" must be a JSON object: {_short(body)}"
        return ToolCall(name, args), ""

    def tools_prompt(self, schemas: list[dict[str, Any]]) -> str:
        lines = "\n".join(json.dumps(s, ensure_ascii=False) for s in schemas)
        return ("# Tools\n\nYou may call one or more functions to help with the user's request. The function "
                f"signatures are inside <tools></tools> XML tags:\n<tools>\n{lines}\n</tools>\n\n"
                "To call a function, write a JSON object with the function's name and arguments inside "
                "<tool_call></tool_call> XML tags:\n"
                '<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>\n'
                "The result comes back in the next message. When you have the final answer, reply without a tool call.")


def _short(s: str, n: int = 120) -> str:
    s = s.strip()
    return s if len(s) <= n else s[:n] + "..."
