"""The OpenAI-compatible endpoint a rollout worker serves to ``rollout.agent`` functions.

One aiohttp server per rollout worker, on 127.0.0.1 and a free port, on the environments' event
loop; each trajectory gets its own base URL ``http://127.0.0.1:<port>/t/<secret>/v1`` (192 random
bits; every request without a live trajectory's secret gets one and the same 404: ``AgentServer``)
so requests are attributed to it and no other program on the machine reaches it. Routes under it: ``POST /chat/completions`` (``messages``, ``tools``,
``tool_choice`` auto, none, required or a named function, ``parallel_tool_calls``,
``max_tokens`` / ``max_completion_tokens``, ``stop``, ``logprobs`` / ``top_logprobs``; the
answer's ``tool_calls`` parsed with ``rollout.tool_parser``), ``POST /completions`` (``prompt`` as
text or token ids, ``logprobs``), ``POST /responses`` (the Responses API, translated to a chat
call: agent_responses.py) and ``GET /models``; ``stream: true`` answers with server-sent events
(agent_wire.py, agent_responses.py).

``tool_choice: required`` (or a named function) shows the tools in the prompt (a named one
alone) and samples again, as a new request of the trajectory, while the answer has no (such) call,
at most ``TOOL_RETRIES`` times within the trajectory's turns and budget: every attempt is sampled
from the policy and trained on, none is constrained (a grammar would change the distribution the
behaviour log-probs come from); the last attempt is answered as sampled.

Sampling is the run's: ``temperature``, ``top_p`` and ``top_k`` come from ``rollout.*``, and a
request that asks for other values gets a 400 (the behaviour log-probs must be those of the
policy that trains). ``seed`` is ignored: call k of a trajectory samples with the seed derived
from the trajectory's. ``n`` must be 1. Every refusal
is an OpenAI-style error body ``{"error": {"message", "type", "param", "code"}}`` with a 4xx
status, so the agent's SDK raises it with its reason.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import secrets
from dataclasses import dataclass, field
from typing import Any, Callable

from grpo_dist.envs.parsers import ToolParser, get_parser
from grpo_dist.rollout import agent_responses
from grpo_dist.rollout.agent_segments import AgentRequestError, AgentTrajectory, Pending
from grpo_dist.rollout.agent_wire import Answer, body as answer_body, chunks, sse
from grpo_dist.rollout.base import SamplingSpec
from grpo_dist.rollout.trajectory import turn_seed

log = logging.getLogger("grpo_dist.rollout")
_FIXED = ("temperature", "top_p", "top_k")
TOOL_RETRIES = 2  # tool_choice required / named: samples after the first while the answer has no such call


@dataclass
class AgentSession:
    """One trajectory's side of the endpoint: its token bookkeeping, its call count and seeds,
    its budget."""

    traj: AgentTrajectory
    submit: Callable[..., Any]  # async (prompt_ids, SamplingSpec, seed) -> Generation (the batcher)
    sampling: SamplingSpec  # the run's (rollout.*): temperature, top_p, top_k, max_tokens, stop
    seed: int | None
    max_model_len: int
    budget: int  # tokens sampled over the whole trajectory (rollout.sampled_budget)
    max_turns: int
    tool_parser: str = "hermes"
    model: str = "policy"
    state_tools: bool = True  # rollout.agent_tools_prompt
    calls: int = 0
    closed: bool = False
    cut: str | None = None  # why the last call (or a refused one) was cut by a limit
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    responses: dict = field(default_factory=dict)  # a /responses answer's id -> its conversation (chat messages)
    versions: list = field(default_factory=list)  # the weight version of each call (None: the worker call's)
    refused: AgentRequestError | None = None  # the first request refused: named if the agent then raises

    def _limits(self, body: dict[str, Any], prompt_len: int) -> tuple[int, str]:
        """The call's max_tokens and what bounds it ("length", "budget", "context")."""
        asked = body.get("max_completion_tokens", body.get("max_tokens"))
        if asked is not None and (isinstance(asked, bool) or not isinstance(asked, int) or asked < 1):
            raise AgentRequestError("max_tokens must be a positive integer", param="max_tokens")
        if self.calls >= self.max_turns:
            self.cut = "max_turns"
            raise AgentRequestError(f"this trajectory made its {self.max_turns} calls (rollout.max_turns)",
                                    code="max_turns")
        left = self.budget - self.traj.sampled
        room = self.max_model_len - prompt_len
        want = self.sampling.max_tokens if asked is None else asked
        if left < 1:
            self.cut = "budget"
            raise AgentRequestError(f"this trajectory sampled its {self.budget} tokens (rollout.max_total_tokens, "
                                    f"else max_turns * max_tokens)", code="budget")
        if room < 1:
            self.cut = "context"
            raise AgentRequestError(f"{prompt_len} prompt tokens leave no room in model.max_model_len "
                                    f"{self.max_model_len}: raise it past {prompt_len + want} (this prompt + "
                                    f"max_tokens {want}) or shorten the agent's messages",
                                    code="context_length_exceeded", param="messages")
        m = min(want, left, room)
        return m, ("length" if m == want else "budget" if m == left else "context")

    def _check(self, body: Any) -> dict[str, Any]:
        if not isinstance(body, dict):
            raise AgentRequestError("the request body must be a JSON object")
        if self.closed:
            raise AgentRequestError("this trajectory has ended (the agent returned or ran past "
                                    "rollout.trajectory_timeout_s)", status=410, code="trajectory_ended")
        if not isinstance(body.get("stream", False), bool):
            raise AgentRequestError("stream must be true or false", param="stream")
        if not isinstance(body.get("stream_options") or {}, dict):
            raise AgentRequestError("stream_options must be an object", param="stream_options")
        if body.get("n", 1) != 1:
            raise AgentRequestError("n must be 1 (each call samples one completion; a group is "
                                    "rollout.group_size calls of the agent)", param="n")
        run = {"temperature": self.sampling.temperature, "top_p": self.sampling.top_p, "top_k": self.sampling.top_k}
        for k in _FIXED:
            v = body.get(k)
            if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or float(v) != float(run[k])):
                raise AgentRequestError(f"{k} {v!r}: the training endpoint samples at rollout.{k} {run[k]!r} (the "
                                        f"behaviour log-probs must be the trained policy's); leave {k} unset",
                                        param=k)
        stop = body.get("stop")
        if stop is not None and not (isinstance(stop, str) or (isinstance(stop, list)
                                                               and all(isinstance(s, str) for s in stop))):
            raise AgentRequestError("stop must be a string or a list of strings", param="stop")
        return body

    def _spec(self, m: int, stop: Any, extra: list[str]) -> SamplingSpec:
        s = self.sampling
        stops = list(s.stop) + ([stop] if isinstance(stop, str) else list(stop or [])) + extra
        return SamplingSpec(n=1, temperature=s.temperature, top_p=s.top_p, top_k=s.top_k, max_tokens=m,
                            stop=list(dict.fromkeys(stops)))

    async def _sample(self, p: Pending, body: dict[str, Any], extra_stop: list[str]):
        m, bound = self._limits(body, len(p.prompt))
        spec = self._spec(m, body.get("stop"), extra_stop)
        seed = None if spec.greedy else turn_seed(self.seed, self.calls)
        self.calls += 1
        out = await self.submit(p.prompt, spec, seed)
        self.versions.append(getattr(out, "version", None))
        if self.closed:
            raise AgentRequestError("this trajectory ended while the call ran", status=410, code="trajectory_ended")
        self.cut = bound if out.finish_reason == "length" else None
        return out

    async def chat(self, body: Any) -> Answer:
        async with self.lock:
            body = self._check(body)
            tools = body.get("tools") or None
            if tools is not None and not (isinstance(tools, list) and all(
                    isinstance(t, dict) and isinstance(t.get("function"), dict) and "name" in t["function"]
                    for t in tools)):
                raise AgentRequestError("tools must be a list of {type: function, function: {name, ...}}",
                                        param="tools")
            tools, choice, named = _tool_choice(body.get("tool_choice"), tools)
            want = _chat_logprobs(body)
            parser: ToolParser | None = get_parser(self.tool_parser) if tools else None
            for attempt in range(1 + (TOOL_RETRIES if choice == "required" else 0)):
                p = self.traj.chat_prompt(body.get("messages"), tools, parser, self.state_tools)
                prompt = list(p.prompt)  # (recording the sample extends the segment p.prompt reads)
                try:
                    out = await self._sample(p, body, list(parser.stop) if parser and choice != "none" else [])
                except AgentRequestError:
                    if attempt == 0:
                        raise
                    break  # the trajectory's turns or budget ran out: the last attempt stands (it is recorded)
                message, finish, text = self._message(out, parser if choice != "none" else None, named, body)
                self.traj.record(p, out.token_ids, out.logprobs, message, text)
                answer = Answer(True, self.model, prompt, list(out.token_ids), list(out.logprobs), finish,
                                self._decode, message=message, want_logprobs=want)
                if choice != "required" or message.get("tool_calls"):
                    break
            return answer

    async def respond(self, body: Any) -> dict[str, Any]:
        """``POST /responses`` (agent_responses.py): translated to a chat call of this trajectory."""
        prev = body.get("previous_response_id") if isinstance(body, dict) else None
        if prev is not None and prev not in self.responses:
            raise AgentRequestError(f"previous_response_id {prev!r} is not a response of this trajectory",
                                    param="previous_response_id", code="previous_response_not_found")
        chat = agent_responses.to_chat(body, self.responses.get(prev, []))
        answer = await self.chat(chat)
        out = agent_responses.response(answer, body)
        self.responses[out["id"]] = chat["messages"] + [answer.message]
        return out

    def _message(self, out, parser: ToolParser | None, named: str | None, body: dict[str, Any]):
        """The assistant message of a sample: its text, or the tool calls ``parser`` finds (only
        ``named``'s when a function was named; the first alone when ``parallel_tool_calls`` is false)."""
        text = self._decode(out.token_ids)  # a stop string stays in
        message: dict[str, Any] = {"role": "assistant", "content": text}
        finish = "stop" if out.finish_reason == "stop" else "length"
        if parser is None:
            return message, finish, text
        parsed = parser.parse(text)
        self.traj.count("tool_calls", parsed.attempted)  # as the tool environments count them
        self.traj.count("tool_errors", len(parsed.errors))
        self.traj.count("tool_malformed", len(parsed.errors))
        calls = [c for c in parsed.calls if named is None or c.name == named]
        if body.get("parallel_tool_calls") is False:
            calls = calls[:1]
        if calls:
            message["content"] = parsed.content or None
            message["tool_calls"] = [{"id": self._call_id(k), "type": "function",
                                      "function": {"name": c.name, "arguments": json.dumps(c.arguments)}}
                                     for k, c in enumerate(calls)]
            finish = "tool_calls"
        return message, finish, text

    def _decode(self, ids: list[int]) -> str:
        return self.traj.tok.decode(ids, skip_special_tokens=True)

    async def completion(self, body: Any) -> Answer:
        async with self.lock:
            body = self._check(body)
            want = body.get("logprobs")
            if want is not None and (isinstance(want, bool) or not isinstance(want, int) or not 0 <= want <= 20):
                raise AgentRequestError("logprobs must be an integer from 0 to 20", param="logprobs")
            prompt = body.get("prompt")
            if isinstance(prompt, list) and len(prompt) == 1 and not isinstance(prompt[0], int):
                prompt = prompt[0]  # one prompt in a list
            if isinstance(prompt, str) and prompt:
                ids = self.traj.tok(prompt)["input_ids"]
            elif isinstance(prompt, list) and prompt and all(
                    isinstance(t, int) and not isinstance(t, bool) and 0 <= t < len(self.traj.tok) for t in prompt):
                ids = list(prompt)
            else:
                raise AgentRequestError("prompt must be one non-empty string or one list of token ids of the "
                                        "model's vocabulary", param="prompt")
            p = self.traj.completion_prompt(ids)
            prompt = list(p.prompt)  # (recording the sample extends the segment p.prompt reads)
            out = await self._sample(p, body, [])
            self.traj.record(p, out.token_ids, out.logprobs, None, self._decode(out.token_ids))
            return Answer(False, self.model, prompt, list(out.token_ids), list(out.logprobs),
                          "stop" if out.finish_reason == "stop" else "length", self._decode, text=out.text,
                          want_logprobs=want)

    def _call_id(self, k: int) -> str:
        """Tool call k's id: no counter in it; from the trajectory's seed when it has one, so a rerun
        gives the same ids (a chat template that renders them gives the same tokens)."""
        if self.seed is None:
            return f"call_{secrets.token_hex(12)}"
        return "call_" + hashlib.sha256(f"{self.seed}:{self.calls}:{k}".encode()).hexdigest()[:24]


def error_body(message: str, status: int, param: str | None = None, code: str | None = None) -> dict[str, Any]:
    kind = "invalid_request_error" if status < 500 else "server_error"
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


class AgentServer:
    """The loopback HTTP server; :meth:`open` gives a trajectory its base URL.

    A base URL is ``http://127.0.0.1:<port>/t/<secret>/v1``: 192 random bits
    (``secrets.token_urlsafe(24)``) per trajectory, made when it opens and forgotten when it
    closes, so any local program can find the port but none reaches a trajectory without its
    agent's URL (the ``api_key`` is ignored; agents work unchanged). One handler answers every
    method and path: without a live trajectory's secret, :data:`NOT_FOUND`, the same bytes for a
    guessed, ended or never-issued secret and for any other path (the root, health probes).
    Sessions are kept by the SHA-256 of their secret: a lookup hashes what the request sent and
    finds it in a dict, so neither a string comparison against a secret (whose time could tell
    how many leading characters matched) nor a scan over the live trajectories (whose time could
    tell how many there are) happens on the request's path.
    """

    def __init__(self, model: str = "policy"):
        self.model, self.port, self._runner = model, None, None
        self._sessions: dict[bytes, AgentSession] = {}  # sha256(secret) -> its live trajectory

    async def start(self) -> None:
        from aiohttp import web

        from grpo_dist.util.ports import free_port

        if self._runner is not None:
            return
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        for attempt in range(5):
            port = free_port()
            try:
                await web.TCPSite(runner, "127.0.0.1", port).start()
            except OSError:
                if attempt == 4:
                    raise
                continue
            self.port, self._runner = port, runner
            return

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    def open(self, session: AgentSession) -> tuple[str, str]:
        """Register a trajectory: (its secret, its base URL)."""
        secret = secrets.token_urlsafe(24)
        self._sessions[_digest(secret)] = session
        return secret, f"http://127.0.0.1:{self.port}/t/{secret}/v1"

    def close(self, secret: str) -> None:
        s = self._sessions.pop(_digest(secret), None)
        if s is not None:
            s.closed = True

    @staticmethod
    def _json(body: dict[str, Any], status: int = 200):
        from aiohttp import web

        return web.json_response(body, status=status)

    def _find(self, path: str) -> tuple[AgentSession, str] | None:
        """The live trajectory ``/t/<secret>/v1/<route>`` names, and the route; None otherwise."""
        parts = path.split("/", 4)  # "", "t", secret, "v1", route
        if len(parts) < 5 or parts[0] or parts[1] != "t" or parts[3] != "v1":
            return None
        s = self._sessions.get(_digest(parts[2]))
        return None if s is None else (s, parts[4])

    async def _handle(self, request):
        found = self._find(request.path)
        if found is None:
            return self._json(NOT_FOUND, 404)
        session, route = found
        try:
            if (request.method, route) == ("GET", "models"):
                return self._json({"object": "list", "data": [{"id": self.model, "object": "model", "created": 0,
                                                               "owned_by": "grpo_dist"}]})
            if request.method != "POST" or route not in ("chat/completions", "completions", "responses"):
                raise AgentRequestError(f"no route {request.method} /{route}: a trajectory's base_url serves POST "
                                        f"/chat/completions, POST /completions, POST /responses and GET /models",
                                        status=404, code="unknown_route")
            try:
                body = await request.json()
            except Exception:  # noqa: BLE001 - any undecodable body is the client's error
                raise AgentRequestError("the request body is not valid JSON") from None
            if route == "responses":
                resp = await session.respond(body)
                if body.get("stream"):
                    return await self._stream(request, agent_responses.sse(agent_responses.events(resp)))
                return self._json(resp)
            answer = await (session.chat(body) if route == "chat/completions" else session.completion(body))
            if body.get("stream"):
                return await self._stream(request, sse(chunks(answer, bool((body.get("stream_options") or {})
                                                                       .get("include_usage")))))
            return self._json(answer_body(answer))
        except AgentRequestError as e:
            session.refused = session.refused or e
            return self._json(error_body(str(e), e.status, e.param, e.code), e.status)
        except Exception as e:  # noqa: BLE001 - the agent reads why, the trajectory goes on
            log.warning("agent endpoint: %s failed: %s: %s", route, type(e).__name__, e)
            return self._json(error_body(f"{type(e).__name__}: {e}", 500), 500)

    @staticmethod
    async def _stream(request, events):
        from aiohttp import web

        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(request)
        for event in events:
            await resp.write(event)
        await resp.write_eof()
        return resp


def _tool_choice(choice: Any, tools: list | None) -> tuple[list | None, str, str | None]:
    """(the tools the prompt shows, "auto" | "none" | "required", the named function or None)."""
    if choice in (None, "auto", "none"):
        return tools, choice or "auto", None
    if choice == "required":
        if not tools:
            raise AgentRequestError("tool_choice 'required' needs tools", param="tool_choice")
        return tools, "required", None
    name = (choice.get("function") or {}).get("name") if isinstance(choice, dict) else None
    if not (isinstance(choice, dict) and choice.get("type") == "function" and isinstance(name, str)):
        raise AgentRequestError("tool_choice must be 'auto', 'none', 'required' or {type: function, function: "
                                "{name}}", param="tool_choice")
    chosen = [t for t in tools or [] if t["function"]["name"] == name]
    if not chosen:
        raise AgentRequestError(f"tool_choice names {name!r}, which is not among the tools", param="tool_choice")
    return chosen, "required", name


def _chat_logprobs(body: dict[str, Any]) -> int | None:
    """None when not asked; else how many alternatives (``top_logprobs``)."""
    want, top = body.get("logprobs"), body.get("top_logprobs")
    if want is not None and not isinstance(want, bool):
        raise AgentRequestError("logprobs must be true or false", param="logprobs")
    if top is not None and (isinstance(top, bool) or not isinstance(top, int) or not 0 <= top <= 20):
        raise AgentRequestError("top_logprobs must be an integer from 0 to 20", param="top_logprobs")
    if top and not want:
        raise AgentRequestError("top_logprobs needs logprobs: true", param="top_logprobs")
    return (top or 0) if want else None


def _digest(secret: str) -> bytes:
    return hashlib.sha256(secret.encode("utf-8", "surrogatepass")).digest()


# the one answer to every request without a live trajectory's secret: no path, method or id echoed
NOT_FOUND = error_body("not found: not the base_url of a live trajectory", 404, code="not_found")
