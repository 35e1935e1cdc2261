"""Agents for tests that load them by file (``rollout.agent: <this file>:fn``): ordinary openai-SDK
code, each appending what it saw to a JSON-lines ``log`` when given one."""

from __future__ import annotations

import json

import openai

TOOLS = [{"type": "function", "function": {"name": "add", "description": "Add two numbers.",
                                           "parameters": {"type": "object", "properties": {
                                               "a": {"type": "number"}, "b": {"type": "number"}}}}}]


def _log(log: str | None, **rec) -> None:
    if log:
        with open(log, "a") as f:
            f.write(json.dumps(rec) + "\n")


def chat_loop(base_url: str, row: dict, turns: int = 3, log: str | None = None, max_tokens: int = 8,
              hold: str | None = None) -> float:
    """A tool-calling loop: ask, answer each turn with a tool message (or a user nudge when the
    model called nothing), ``turns`` calls; returns the number of calls as its reward. With
    ``hold``: after the first call, write the endpoint's port to ``<hold>.port`` (not the secret)
    and wait until the file ``hold`` exists (at most 120 s) before going on."""
    client = openai.OpenAI(base_url=base_url, api_key="-", max_retries=0)
    messages = [{"role": "system", "content": "You add."}, {"role": "user", "content": str(row["prompt"])}]
    seen = []
    for k in range(turns):
        r = client.chat.completions.create(model="policy", messages=messages, tools=TOOLS, max_tokens=max_tokens)
        msg = r.choices[0].message
        seen.append({"content": msg.content, "finish": r.choices[0].finish_reason, "usage": r.usage.model_dump(),
                     "tool_calls": [c.model_dump() for c in msg.tool_calls or []]})
        messages.append(msg.model_dump(exclude_none=True))  # the message as the SDK gave it back
        for c in msg.tool_calls or []:
            messages.append({"role": "tool", "tool_call_id": c.id, "content": "42"})
        if not msg.tool_calls:
            messages.append({"role": "user", "content": f"Again ({k})."})
        if hold and k == 0:
            _hold(base_url, hold)
    _log(log, prompt=row["prompt"], turns=seen)
    return float(turns)


def _hold(base_url: str, hold: str) -> None:
    import os
    import time
    import urllib.parse

    tmp = f"{hold}.port.{os.getpid()}.{id(base_url)}"
    with open(tmp, "w") as f:
        f.write(str(urllib.parse.urlsplit(base_url).port))
    os.replace(tmp, f"{hold}.port")
    deadline = time.monotonic() + 120
    while not os.path.exists(hold) and time.monotonic() < deadline:
        time.sleep(0.05)


def rewriting(base_url: str, row: dict, log: str | None = None) -> None:
    """Call 1, call 2 extending it, then call 3 with the history rewritten (a summary): 2 segments."""
    client = openai.OpenAI(base_url=base_url, api_key="-", max_retries=0)
    messages = [{"role": "user", "content": str(row["prompt"])}]
    a = client.chat.completions.create(model="policy", messages=messages, max_tokens=6).choices[0].message
    messages += [{"role": "assistant", "content": a.content}, {"role": "user", "content": "More."}]
    b = client.chat.completions.create(model="policy", messages=messages, max_tokens=6).choices[0].message
    summary = [{"role": "user", "content": f"Summary: {a.content}{b.content}. Go on."}]
    c = client.chat.completions.create(model="policy", messages=summary, max_tokens=6).choices[0].message
    _log(log, said=[a.content, b.content, c.content])


def completions(base_url: str, row: dict, log: str | None = None) -> float:
    """/v1/models, then /v1/completions twice: text, then token ids extending it (the ids the
    first answer carried, then 3 more)."""
    client = openai.OpenAI(base_url=base_url, api_key="-", max_retries=0)
    model = client.models.list().data[0].id
    first = client.completions.create(model=model, prompt=str(row["prompt"]), max_tokens=5)
    ids = first.model_extra["prompt_token_ids"] + first.choices[0].model_extra["token_ids"] + [5, 6, 7]
    second = client.completions.create(model=model, prompt=ids, max_tokens=5)
    _log(log, model=model, ids=ids, texts=[first.choices[0].text, second.choices[0].text])
    return 1.0


def bad_requests(base_url: str, row: dict, log: str | None = None) -> float:
    """Requests the endpoint refuses; each OpenAI error's status and message logged; then one good call."""
    client = openai.OpenAI(base_url=base_url, api_key="-", max_retries=0)
    msgs = [{"role": "user", "content": "hi"}]
    tries = {"temperature": dict(temperature=0.3), "top_p": dict(top_p=0.5), "n": dict(n=2),
             "tool_choice": dict(tool_choice={"type": "function", "function": {"name": "nope"}}), "role": dict(messages=[{"role": "wizard", "content": "x"}]),
             "image": dict(messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]),
             "max_tokens": dict(max_tokens=0)}
    errors = {}
    for name, kw in tries.items():
        try:
            client.chat.completions.create(**{"model": "policy", "messages": msgs, **kw})
            errors[name] = None
        except openai.APIStatusError as e:
            errors[name] = [e.status_code, e.message]
    try:
        client.embeddings.create(model="policy", input="x")
    except openai.APIStatusError as e:
        errors["embeddings"] = [e.status_code, e.message]
    ok = client.chat.completions.create(model="policy", messages=msgs, max_tokens=3)
    _log(log, errors=errors, ok=ok.choices[0].finish_reason)
    return 0.5


async def async_hang(base_url: str, row: dict, sleep_s: float = 30.0) -> float:
    """An async agent that makes one call, then hangs."""
    import asyncio

    client = openai.AsyncOpenAI(base_url=base_url, api_key="-", max_retries=0)
    await client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "hi"}], max_tokens=3)
    await asyncio.sleep(sleep_s)
    return 1.0


def raises(base_url: str, row: dict) -> float:
    raise RuntimeError("the agent broke")


def over_budget(base_url: str, row: dict, log: str | None = None) -> None:
    """Asks for 100 tokens twice; the second call finds the trajectory's budget spent."""
    client = openai.OpenAI(base_url=base_url, api_key="-", max_retries=0)
    msgs = [{"role": "user", "content": "hi"}]
    first = client.chat.completions.create(model="policy", messages=msgs, max_tokens=100)
    msgs += [first.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": "go on"}]
    try:
        client.chat.completions.create(model="policy", messages=msgs, max_tokens=100)
        second = None
    except openai.BadRequestError as e:
        second = [e.status_code, e.message]
    _log(log, first=[first.usage.completion_tokens, first.choices[0].finish_reason], second=second)


def probe(base_url: str, row: dict, log: str | None = None, payload: str = "INJECTED-BY-ANOTHER-PROCESS") -> float:
    """While live: another program's guesses (tests/agent_attacker.py, near misses of this
    trajectory's own secret included) against this endpoint, then this trajectory's own routes
    with its base_url (the SDK, and the raw HTTP answer of each route); each part logged when done,
    as a line ``{"base_url", ...}``."""
    import importlib.util
    import urllib.parse
    from pathlib import Path

    spec = importlib.util.spec_from_file_location("agent_attacker", Path(__file__).with_name("agent_attacker.py"))
    attacker = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(attacker)
    url = urllib.parse.urlsplit(base_url)
    secret = url.path.split("/")[2]
    _log(log, base_url=base_url, guessed=attacker.attack(url.port, payload, near=secret, timeout=2.0))
    client = openai.OpenAI(base_url=base_url, api_key="any key", max_retries=0)
    model = client.models.list().data[0].id
    chat = client.chat.completions.create(model=model, messages=[{"role": "user", "content": str(row["prompt"])}],
                                          tools=TOOLS, max_tokens=4)
    msgs = [{"role": "user", "content": str(row["prompt"])}, chat.choices[0].message.model_dump(exclude_none=True),
            {"role": "user", "content": "Go on."}]
    raw = {"models": attacker.attempt(url.port, "GET", f"{url.path}/models", "", 30.0),
           "chat/completions": _post(f"{base_url}/chat/completions", {"messages": msgs, "tools": TOOLS,
                                                                      "max_tokens": 4}),
           "completions": _post(f"{base_url}/completions", {"prompt": "2 + 2 =", "max_tokens": 4}),
           "embeddings": _post(f"{base_url}/embeddings", {"input": "x"})}
    _log(log, base_url=base_url, model=model, raw=raw)
    return 1.0


def _post(url: str, body: dict) -> list:
    import urllib.error
    import urllib.request

    req = urllib.request.Request(url, data=json.dumps({"model": "policy", **body}).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30.0) as r:
            return ["POST", url, r.status, r.read().decode(), dict(r.headers)]
    except urllib.error.HTTPError as e:
        return ["POST", url, e.code, e.read().decode(), dict(e.headers)]


def retrying(base_url: str, row: dict) -> float:
    """The openai SDK's defaults (2 retries of a 5xx with back-off), two calls: as a new user's agent."""
    client = openai.OpenAI(base_url=base_url, api_key="-")
    messages = [{"role": "user", "content": str(row["prompt"])}]
    for _ in range(2):
        msg = client.chat.completions.create(model="policy", messages=messages, max_tokens=4).choices[0].message
        messages += [{"role": "assistant", "content": msg.content}, {"role": "user", "content": "Go on."}]
    return 1.0


def wire(base_url: str, row: dict, log: str | None = None) -> float:
    """What frameworks send: a chat call with log-probs, the same streamed (usage included), a
    streamed completion, a call with tool_choice required, one naming a function with
    parallel_tool_calls false. Logs what each answer carried."""
    client = openai.OpenAI(base_url=base_url, api_key="-", max_retries=0)
    msgs = [{"role": "user", "content": str(row["prompt"])}]
    a = client.chat.completions.create(model="policy", messages=msgs, max_tokens=6, logprobs=True, top_logprobs=2)
    c = a.choices[0]
    plain = {"text": c.message.content, "ids": c.model_extra["token_ids"],
             "lps": [t.logprob for t in c.logprobs.content], "tops": [len(t.top_logprobs) for t in c.logprobs.content]}
    parts, lps, usage, finish, ids = [], [], None, None, None
    for ch in client.chat.completions.create(model="policy", messages=msgs, max_tokens=6, stream=True, logprobs=True,
                                             stream_options={"include_usage": True}):
        if ch.usage is not None:
            usage = ch.usage.completion_tokens
        for x in ch.choices:
            parts.append(x.delta.content or "")
            lps += [t.logprob for t in (x.logprobs.content if x.logprobs else [])]
            finish = x.finish_reason or finish
            ids = x.model_extra.get("token_ids") or ids
    streamed = {"text": "".join(parts), "lps": lps, "usage": usage, "finish": finish, "ids": ids}
    pieces = [x.choices[0].text for x in client.completions.create(model="policy", prompt=str(row["prompt"]),
                                                                     max_tokens=5, stream=True, logprobs=0)]
    req = client.chat.completions.create(model="policy", messages=msgs, max_tokens=6, tools=TOOLS,
                                         tool_choice="required")
    named = client.chat.completions.create(model="policy", messages=msgs, max_tokens=6, tools=TOOLS,
                                           tool_choice={"type": "function", "function": {"name": "add"}},
                                           parallel_tool_calls=False)
    _log(log, plain=plain, streamed=streamed, completion="".join(pieces),
         required=[req.choices[0].finish_reason, len(req.choices[0].message.tool_calls or [])],
         named=[named.choices[0].finish_reason, len(named.choices[0].message.tool_calls or [])])


def say_7(base_url: str, row: dict) -> float:
    """One short plain request (no tools): the first engine call of a worker is one small batch."""
    client = openai.OpenAI(base_url=base_url, api_key="-", max_retries=0)
    client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "say 7"}], max_tokens=4)
    return 1.0


RESPONSE_TOOLS = [{"type": "function", "name": "add", "description": "Add two numbers.",
                   "parameters": {"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}}}}]


def responses(base_url: str, row: dict, log: str | None = None) -> float:
    """The Responses API as the OpenAI Agents SDK calls it: instructions, input, function tools;
    then the next turn through previous_response_id (a function_call_output for each call, else a
    user message); then a fresh input (a new segment)."""
    client = openai.OpenAI(base_url=base_url, api_key="-", max_retries=0)
    r1 = client.responses.create(model="policy", instructions="You add numbers.", input=str(row["prompt"]),
                                 tools=RESPONSE_TOOLS, max_output_tokens=6)
    calls = [it for it in r1.output if it.type == "function_call"]
    nxt = ([{"type": "function_call_output", "call_id": c.call_id, "output": "7"} for c in calls]
           or [{"role": "user", "content": "Go on."}])
    r2 = client.responses.create(model="policy", previous_response_id=r1.id, input=nxt, tools=RESPONSE_TOOLS,
                                 max_output_tokens=6)
    r3 = client.responses.create(model="policy", input=[{"role": "user", "content": [
        {"type": "input_text", "text": "hi"}]}], max_output_tokens=4)
    kinds, text, r4 = [], "", None  # streamed: the events as the SDK types them
    for ev in client.responses.create(model="policy", input="Say 7.", tools=RESPONSE_TOOLS, max_output_tokens=6,
                                      stream=True):
        kinds.append(ev.type)
        text += ev.delta if ev.type == "response.output_text.delta" else ""
        r4 = ev.response if ev.type in ("response.completed", "response.incomplete") else r4
    _log(log, rs=[[r.status, r.output_text, r.usage.output_tokens, len([i for i in r.output if i.type == "function_call"])]
                  for r in (r1, r2, r3, r4)], streamed=[kinds, text])
    return 1.0


LONG_SYSTEM = "You solve sums step by step. " + " ".join(f"Rule {i}: add {i} and {i + 1}." for i in range(400))


class AgentGenerationError(Exception):
    """A framework's wrapper of the SDK's error, as smolagents writes it (smolagents.utils.AgentGenerationError):
    the message is "Error while generating output:\\n<the error>", its first line empty of the reason."""


def too_long(base_url: str, row: dict, wrap: bool = True) -> float:
    """A system prompt longer than the context (as smolagents' ~1,300 tokens in 1,024): the first
    request is refused; the SDK's error is raised wrapped as a framework does (``wrap``), or as is."""
    client = openai.OpenAI(base_url=base_url, api_key="-", max_retries=0)
    msgs = [{"role": "system", "content": LONG_SYSTEM}, {"role": "user", "content": str(row["prompt"])}]
    try:
        client.chat.completions.create(model="policy", messages=msgs, max_tokens=8)
    except openai.BadRequestError as e:
        if not wrap:
            raise
        raise AgentGenerationError(f"Error while generating output:\n{e}") from e
    return 1.0


def smolagents_plain(base_url: str, row: dict) -> float:
    """smolagents' ToolCallingAgent as its docs write it (no tools of its own: its final_answer
    tool and system prompt), nothing caught: a new user's agent."""
    from smolagents import OpenAIServerModel, ToolCallingAgent

    llm = OpenAIServerModel(model_id="policy", api_base=base_url, api_key="-", client_kwargs={"max_retries": 0})
    agent = ToolCallingAgent(tools=[], model=llm, max_steps=1, verbosity_level=0)
    agent.run(str(row["prompt"]))
    return 1.0
