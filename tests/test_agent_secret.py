"""Only a trajectory's own agent reaches its endpoint (issue 41): each base_url carries a secret
of its own, and every request without it gets one and the same 404, the answer for a trajectory
that never existed. Real worker (transformers backend, the seeded tiny Llama over a byte-level BPE
vocabulary of tests/bpe_model.py), agents of tests/agent_helpers.py; the other program's requests
are tests/agent_attacker.py (here in the agent's thread; from a second process in
tests/test_agent_endpoint.py).

* guessed ids (0..50, random strings, odd ones), near misses of the trajectory's own secret, every
  route, the root and health-like paths: one 404, byte for byte (headers apart from date and
  length), and none of their text in any trained sample;
* the right secret works with any api_key, through the SDK and raw HTTP, and after the trajectory
  ends it gets the same 404;
* answers carry OpenAI's fields and vLLM's token ids, nothing else: no trajectory ids, counters
  or addresses, and no secret.
"""

from __future__ import annotations

import json
import re
import urllib.parse
from pathlib import Path

import pytest

from agent_attacker import NEVER, ROOTS, attempt, not_refused, same_answer
from bpe_model import agent_worker
from grpo_dist.data import make_task

HELPERS = Path(__file__).parent / "agent_helpers.py"
PAYLOAD = "INJECTED-BY-ANOTHER-PROCESS"


@pytest.fixture(scope="module")
def probed(tmp_path_factory):
    """One worker call of the ``probe`` agent (2 records x 2 trajectories): its log, its rollouts."""
    tmp = tmp_path_factory.mktemp("secret")
    log = tmp / "log.jsonl"
    with agent_worker(tmp, f"{HELPERS}:probe", max_turns=4) as w:
        groups = w.generate(make_task("add", 2, seed=5, split="eval"), keys=[(1, 1, i) for i in range(2)])
        port = urllib.parse.urlsplit(json.loads(log.read_text().splitlines()[0])["base_url"]).port
        never = attempt(port, "GET", f"/t/{NEVER}/v1/models", "")
        rollouts = [r for g in groups for r in g.rollouts]
        seen: dict[str, dict] = {}  # each trajectory's log lines, merged
        for line in log.read_text().splitlines():
            rec = json.loads(line)
            seen.setdefault(rec["base_url"], {}).update(rec)
        yield list(seen.values()), rollouts, never, trained_text(w.engine.tokenizer, rollouts)


def trained_text(tok, rollouts) -> str:
    """Everything a batch holds of these rollouts, as text: each sample's tokens, its prompt and
    completion, its messages."""
    samples = [x for r in rollouts for x in [r] + list(r.segments or [])]
    return "\n".join(tok.decode(x.prompt_ids + x.completion_ids) + x.prompt + x.completion + json.dumps(x.messages)
                     for x in samples)


def test_without_the_secret_every_request_gets_the_404_of_a_trajectory_that_never_existed(probed):
    seen, _, never, text = probed
    assert never[2] == 404
    assert len(seen) == 4 and len({s["base_url"] for s in seen}) == 4
    for s in seen:
        guessed = s["guessed"]
        assert len(guessed) > 700
        assert not_refused(guessed, never) == []
        assert sum(g[0] == "HEAD" for g in guessed) == len(ROOTS)  # HEAD too: the same status and headers
    assert PAYLOAD not in text and "2 + 2 =" in text  # the agents' own requests are there


def test_the_right_secret_works_with_any_key_until_the_trajectory_ends(probed):
    seen, rollouts, never, _ = probed
    secrets_ = [urllib.parse.urlsplit(s["base_url"]).path.split("/")[2] for s in seen]
    assert all(len(x) >= 32 and re.fullmatch(r"[A-Za-z0-9_-]+", x) for x in secrets_)  # >= 192 bits, urlsafe
    for s in seen:
        raw = s["raw"]
        assert raw["models"][2] == 200 and raw["chat/completions"][2] == 200 and raw["completions"][2] == 200
        assert raw["embeddings"][2] == 404 and "POST /chat/completions" in raw["embeddings"][3]
        url = urllib.parse.urlsplit(s["base_url"])
        for method, route in (("GET", "models"), ("POST", "chat/completions"), ("POST", "completions")):
            after = attempt(url.port, method, f"{url.path}/{route}", "late")  # ended: as if it never existed
            assert same_answer(after, never), after
    for r in rollouts:
        assert (r.turns, r.columns["env_reward"], r.columns["agent_segments"]) == (3, 1.0, 2), r.columns


def test_answers_carry_openai_fields_and_token_ids_only(probed):
    seen, *_ = probed
    ids = set()
    for s in seen:
        secret = urllib.parse.urlsplit(s["base_url"]).path.split("/")[2]
        raw = {k: json.loads(v[3]) for k, v in s["raw"].items()}
        assert all(secret not in json.dumps(v) for v in raw.values())
        assert raw["models"] == {"object": "list", "data": [{"id": s["model"], "object": "model", "created": 0,
                                                              "owned_by": "grpo_dist"}]}
        for route, obj in (("chat/completions", "chat.completion"), ("completions", "text_completion")):
            a = raw[route]
            assert set(a) == {"id", "object", "created", "model", "choices", "usage", "prompt_token_ids"}, a
            assert a["object"] == obj and a["model"] == s["model"]
            (c,) = a["choices"]
            assert set(c) == {"index", "finish_reason", "logprobs", "token_ids",
                              "message" if route == "chat/completions" else "text"}, c
            assert set(a["usage"]) == {"prompt_tokens", "completion_tokens", "total_tokens"}
            assert re.fullmatch(r"(chatcmpl|cmpl)-[0-9a-f]{32}", a["id"]), a["id"]  # random, as vLLM's
            ids.add(a["id"])
            for t in (c.get("message") or {}).get("tool_calls") or []:
                assert re.fullmatch(r"call_[0-9a-f]{24}", t["id"]), t
    assert len(ids) == 2 * len(seen)
