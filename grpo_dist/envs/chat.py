"""Chat-template token pieces for multi-turn trajectories: token in, token out.

A trajectory is never re-rendered. Its pieces are:

* the opening: the environment's opening messages rendered once with the generation prompt
  (tool schemas through the template's ``tools=`` where it takes them, else stated in the system
  prompt in the tool parser's format);
* the sampled ids of each turn, as the engine returned them;
* each environment answer: :class:`MessageEncoder`, the text the template adds for those
  messages after a fixed base conversation, tokenized on its own.

That concatenation equals the template's rendering of the whole conversation only if the
template is *prefix-preserving* (rendering one more message never changes how the earlier ones
render). :func:`check_template` checks this at start-up and raises :class:`TemplateError`
naming the problem (e.g. a template that drops earlier turns' reasoning blocks, or refuses a
role). :func:`first_difference` compares built ids with a full re-render (``rollout.env_sanity``).
"""

from __future__ import annotations

from typing import Any

_BASE = [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}]
# a probe conversation: every role a trajectory may hold, an assistant turn with a reasoning block
_PROBE = [{"role": "system", "content": "S."}, {"role": "user", "content": "Q1?"},
          {"role": "assistant", "content": "<think>\nplan A\n</think>\n\nA1."},
          {"role": "tool", "content": "R1"}, {"role": "assistant", "content": "<think>\nplan B\n</think>\n\nA2."},
          {"role": "user", "content": "Q2?"}, {"role": "assistant", "content": "A3."}]


class TemplateError(ValueError):
    """The chat template cannot give exact tokens across turns (one line saying why)."""


def has_template(tok: Any) -> bool:
    return bool(getattr(tok, "chat_template", None))


def render(tok: Any, messages: list[dict[str, Any]], generation_prompt: bool = False, tools=None) -> str:
    kw = {"tools": tools} if tools else {}
    return tok.apply_chat_template(list(messages), tokenize=False, add_generation_prompt=generation_prompt, **kw)


def check_template(tok: Any, roles: tuple[str, ...] = ("user", "tool")) -> None:
    """Raise TemplateError unless ``tok``'s chat template renders every prefix of a probe
    conversation (system, user, assistant with a reasoning block, tool, ...) as a prefix of the
    longer one, and the generation prompt as the start of the assistant turn that follows."""
    if not has_template(tok):
        return  # plain text: messages are appended as their contents
    probe = [m for m in _PROBE if m["role"] in ("system", "assistant") or m["role"] in roles]
    for k in range(1, len(probe)):
        try:
            shorter, longer = render(tok, probe[:k]), render(tok, probe[:k + 1])
        except Exception as e:  # noqa: BLE001 - jinja raise_exception, TemplateError, ...
            raise TemplateError(f"the chat template cannot render a {probe[k]['role']!r} message after "
                                f"{[m['role'] for m in probe[:k]]}: {type(e).__name__}: {e}") from None
        if not longer.startswith(shorter):
            at = _diverge(shorter, longer)
            raise TemplateError(
                f"the chat template is not prefix-preserving: adding a {probe[k]['role']!r} message after "
                f"{[m['role'] for m in probe[:k]]} re-renders the earlier messages (first difference at char {at}: "
                f"{shorter[at:at + 40]!r} becomes {longer[at:at + 40]!r}; e.g. a template that drops earlier "
                f"turns' reasoning blocks); multi-turn trajectories need a template that never rewrites earlier turns")
        if probe[k]["role"] == "assistant":
            prompt = render(tok, probe[:k], generation_prompt=True)
            if not longer.startswith(prompt):
                at = _diverge(prompt, longer)
                raise TemplateError(
                    f"the chat template's generation prompt is not the start of the assistant turn it announces "
                    f"(after {[m['role'] for m in probe[:k]]}, char {at}: {prompt[at:at + 40]!r} vs "
                    f"{longer[at:at + 40]!r})")


def _diverge(a: str, b: str) -> int:
    n = min(len(a), len(b))
    return next((i for i in range(n) if a[i] != b[i]), n)


def takes_tools(tok: Any, schemas: list[dict[str, Any]]) -> bool:
    """True if the chat template renders ``tools=`` (a tool's name appears in the rendering)."""
    if not schemas or not has_template(tok):
        return False
    try:
        text = render(tok, [{"role": "user", "content": "x"}], tools=schemas)
    except Exception:  # noqa: BLE001
        return False
    return schemas[0]["function"]["name"] in text


def opening_messages(tok: Any, messages: list[dict[str, Any]], schemas=None, parser=None) -> tuple[list, Any]:
    """``(messages, tools)`` to render the opening with: tools through the template if it takes
    them, else the parser's statement of them added to (or as) the system message."""
    messages = [dict(m) for m in messages]
    if not schemas:
        return messages, None
    if takes_tools(tok, schemas) or parser is None:
        return messages, schemas
    text = parser.tools_prompt(schemas)
    if messages and messages[0].get("role") == "system":
        messages[0]["content"] = f"{messages[0]['content']}\n\n{text}"
    else:
        messages.insert(0, {"role": "system", "content": text})
    return messages, None


def encode_opening(tok: Any, messages: list[dict[str, Any]], schemas=None, parser=None) -> list[int]:
    """The prompt ids of an environment's opening messages (chat template + generation prompt)."""
    if not has_template(tok):
        return tok("".join(str(m.get("content", "")) for m in messages))["input_ids"]
    msgs, tools = opening_messages(tok, messages, schemas, parser)
    return tok(render(tok, msgs, True, tools), add_special_tokens=False)["input_ids"]  # the template holds the BOS


class MessageEncoder:
    """The token ids an environment's messages add after an assistant turn: the chat template's
    rendering of (a fixed base conversation + the messages + the next assistant header) past the
    base's assistant content. The end-of-turn text is left out when the model sampled it (the turn
    ended on a special token that the text starts with); when the turn ended on a stop string
    (``</tool_call>``) it stays, as glue with loss mask 0. Without a chat template: the contents."""

    def __init__(self, tokenizer: Any, check: bool = True):
        self.tok = tokenizer
        self.template = has_template(tokenizer)
        if self.template:
            if check:
                check_template(tokenizer)
            base = render(tokenizer, _BASE)
            self._cut = base.rindex(_BASE[-1]["content"]) + len(_BASE[-1]["content"])
            self._special = set(getattr(tokenizer, "all_special_ids", []) or [])

    def __call__(self, messages: list[dict[str, Any]], last_sampled: int | None = None) -> list[int]:
        if not messages:
            return []
        if not self.template:
            text = "".join(str(m.get("content", "")) for m in messages)
        else:
            text = render(self.tok, _BASE + list(messages), generation_prompt=True)[self._cut:]
            if last_sampled is not None and last_sampled in self._special:
                ended = self.tok.decode([last_sampled])
                if ended and text.startswith(ended):
                    text = text[len(ended):]  # the model sampled the end of its turn
        return self.tok(text, add_special_tokens=False)["input_ids"]


def cap_tool_messages(tok: Any, messages: list[dict[str, Any]], cap: int | None) -> tuple[list[dict[str, Any]], int]:
    """Tool messages whose content is longer than ``cap`` tokens cut in the middle (head and tail
    kept, a marker saying how many tokens went); returns (messages, how many were cut)."""
    if not cap:
        return messages, 0
    out, cut = [], 0
    for m in messages:
        content = m.get("content")
        if m.get("role") == "tool" and isinstance(content, str):
            ids = tok(content, add_special_tokens=False)["input_ids"]
            if len(ids) > cap:
                head, tail = cap // 2, cap - cap // 2
                gone = len(ids) - cap
                m = {**m, "content": (tok.decode(ids[:head]) + f"\n...[{gone} tokens cut]...\n"
                                      + (tok.decode(ids[-tail:]) if tail else ""))}
                cut += 1
        out.append(m)
    return out, cut


def first_difference(built: list[int], reference: list[int]) -> int:
    """The first index where ``built`` differs from ``reference`` over ``built``'s length (a
    full rendering also closes the last turn); -1 if none."""
    for i, x in enumerate(built):
        if i >= len(reference) or reference[i] != x:
            return i
    return -1
