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
render). Templates that rewrite history (Qwen3's drops earlier turns' reasoning and the empty
reasoning block of the last turn) get a *training template* of their family
(``envs/templates/``, :data:`TRAINING_TEMPLATES`): the same opening, messages and generation
prompt, every assistant turn kept as sampled. It is used for every rendering here
(:func:`template_for`) when the model's own template is not prefix-preserving and the training
template renders the opening exactly as the model's does. :func:`check_template` checks the
template in use at start-up and raises :class:`TemplateError` naming the problem and what to do.
:func:`first_difference` compares built ids with a full re-render (``rollout.env_sanity``).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Callable, Optional

log = logging.getLogger("grpo_dist.envs")

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


def _qwen3(source: str) -> bool:
    return all(x in source for x in ("<|im_start|>", "reasoning_content", "last_query_index", "<tool_response>"))


# family -> (does a model's chat template belong to it, its training template's file in envs/templates/)
TRAINING_TEMPLATES: dict[str, tuple[Callable[[str], bool], str]] = {"qwen3": (_qwen3, "qwen3_training.jinja")}
_CHOSEN: dict[tuple[int, str], tuple[Any, Optional[str]]] = {}  # (id(tokenizer), its template) -> (it, template used)


def template_for(tok: Any) -> Optional[str]:
    """The chat template multi-turn renders with: None for the tokenizer's own (prefix-preserving,
    or no training template fits), else its family's training template (decided once per tokenizer)."""
    key = (id(tok), str(getattr(tok, "chat_template", None)))
    hit = _CHOSEN.get(key)
    if hit is not None and hit[0] is tok:
        return hit[1]
    chosen = None
    if has_template(tok) and _problem(tok, None) is not None:
        for family, (belongs, name) in TRAINING_TEMPLATES.items():
            if not belongs(tok.chat_template):
                continue
            text = (Path(__file__).parent / "templates" / name).read_text()
            if _problem(tok, text) is None and _same_opening(tok, text):
                log.info("the model's chat template rewrites earlier turns; multi-turn renders with the %s "
                         "training template (envs/templates/%s: every turn kept as sampled)", family, name)
                chosen = text
                break
    _CHOSEN[key] = (tok, chosen)
    return chosen


def render(tok: Any, messages: list[dict[str, Any]], generation_prompt: bool = False, tools=None,
           template: Optional[str] | bool = True) -> str:
    """The chat template's text for ``messages``; ``template``: True = the one multi-turn uses
    (:func:`template_for`), None = the tokenizer's own, or a template's source."""
    kw: dict[str, Any] = {"tools": tools} if tools else {}
    chosen = template_for(tok) if template is True else template
    if chosen:
        kw["chat_template"] = chosen
    return tok.apply_chat_template(list(messages), tokenize=False, add_generation_prompt=generation_prompt, **kw)


def _same_opening(tok: Any, template: str) -> bool:
    """``template`` renders an opening (with and without a system message and tools, generation
    prompt on) exactly as the tokenizer's own does: turn one is what the model would see served."""
    tools = [{"type": "function", "function": {"name": "probe", "description": "d.",
                                                 "parameters": {"type": "object", "properties": {}}}}]
    for msgs in (_PROBE[1:2], _PROBE[:2]):
        for t in (None, tools):
            try:
                if render(tok, msgs, True, t, template=None) != render(tok, msgs, True, t, template=template):
                    return False
            except Exception:  # noqa: BLE001
                return False
    return True


def _problem(tok: Any, template: Optional[str], roles: tuple[str, ...] = ("user", "tool")) -> Optional[str]:
    """Why ``template`` (None: the tokenizer's own) cannot give exact tokens across turns: unless
    it renders every prefix of a probe conversation (system, user, assistant with a reasoning
    block, tool, ...) as a prefix of the longer one, and the generation prompt as the start of the
    assistant turn that follows. None if it can."""
    probe = [m for m in _PROBE if m["role"] in ("system", "assistant") or m["role"] in roles]
    for k in range(1, len(probe)):
        try:
            shorter, longer = render(tok, probe[:k], template=template), render(tok, probe[:k + 1], template=template)
        except Exception as e:  # noqa: BLE001 - jinja raise_exception, TemplateError, ...
            return (f"the chat template cannot render a {probe[k]['role']!r} message after "
                    f"{[m['role'] for m in probe[:k]]}: {type(e).__name__}: {e}")
        if not longer.startswith(shorter):
            at = _diverge(shorter, longer)
            return (f"the chat template is not prefix-preserving: adding a {probe[k]['role']!r} message after "
                    f"{[m['role'] for m in probe[:k]]} re-renders the earlier messages (first difference at char {at}: "
                    f"{shorter[at:at + 40]!r} becomes {longer[at:at + 40]!r}; e.g. a template that drops earlier "
                    f"turns' reasoning blocks)")
        if probe[k]["role"] == "assistant":
            prompt = render(tok, probe[:k], generation_prompt=True, template=template)
            if not longer.startswith(prompt):
                at = _diverge(prompt, longer)
                return (f"the chat template's generation prompt is not the start of the assistant turn it announces "
                        f"(after {[m['role'] for m in probe[:k]]}, char {at}: {prompt[at:at + 40]!r} vs "
                        f"{longer[at:at + 40]!r})")
    return None


def check_template(tok: Any, roles: tuple[str, ...] = ("user", "tool")) -> None:
    """Raise TemplateError unless the template multi-turn renders with (:func:`template_for`) gives
    exact tokens across turns (:func:`_problem`), saying what to do."""
    if not has_template(tok):
        return  # plain text: messages are appended as their contents
    problem = _problem(tok, template_for(tok), roles)
    if problem is not None:
        families = ", ".join(TRAINING_TEMPLATES)
        raise TemplateError(f"{problem}; multi-turn trajectories need a template that never rewrites earlier "
                            f"turns: grpo_dist brings training templates for {families} (grpo_dist/envs/templates/); "
                            f"for another family, set a prefix-preserving chat_template in the model's "
                            f"tokenizer_config.json")


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
