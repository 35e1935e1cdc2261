"""The segment rule of an agent trajectory (grpo_dist/rollout/agent_segments.py), on a real
byte-level BPE tokenizer with a ChatML template (tests/bpe_model.py), no engine: a request that
extends the conversation so far (its messages, the assistant answers as returned, the same tools)
appends only the template's tokens of the added messages; anything else opens a new segment."""

from __future__ import annotations

import pytest

from bpe_model import make_bpe_tokenizer
from grpo_dist.envs.chat import MessageEncoder, render
from grpo_dist.envs.parsers import get_parser
from grpo_dist.rollout.agent_segments import AgentRequestError, AgentTrajectory

TOOLS = [{"type": "function", "function": {"name": "calc", "parameters": {"type": "object"}}}]


@pytest.fixture(scope="module")
def tok():
    return make_bpe_tokenizer()


def _turn(traj, tok, messages, reply_ids, tools=None, tool_calls=None):
    """One request: where it samples, then a made-up sampled turn recorded with log-probs -0.5."""
    p = traj.chat_prompt(messages, tools, get_parser("hermes") if tools else None)
    prompt = p.prompt
    msg = {"role": "assistant", "content": tok.decode(reply_ids, skip_special_tokens=True)}
    if tool_calls:
        msg = {"role": "assistant", "content": None, "tool_calls": tool_calls}
    traj.record(p, reply_ids, [-0.5] * len(reply_ids), msg, msg["content"] or "")
    return prompt, msg


def test_extending_requests_append_only_the_added_messages(tok):
    enc = MessageEncoder(tok)
    traj = AgentTrajectory(tok, enc)
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    a = tok("hello there", add_special_tokens=False)["input_ids"] + [eos]
    msgs = [{"role": "system", "content": "S."}, {"role": "user", "content": "Q?"}]
    p1, m1 = _turn(traj, tok, msgs, a)
    assert p1 == tok(render(tok, msgs, True), add_special_tokens=False)["input_ids"]
    msgs2 = msgs + [m1, {"role": "user", "content": "More?"}]
    b = tok("ok", add_special_tokens=False)["input_ids"]
    p2, _ = _turn(traj, tok, msgs2, b)
    glue = enc([{"role": "user", "content": "More?"}], eos)
    assert p2 == p1 + a + glue  # the sampled ids as they were, then only the template's tokens for the new message
    seg = traj.current
    assert len(traj.segments) == 1 and seg.mask == [1] * len(a) + [0] * len(glue) + [1] * len(b)
    assert seg.ids == a + glue + b and seg.logprobs == [-0.5] * len(a) + [0.0] * len(glue) + [-0.5] * len(b)


def test_tool_calls_round_trip_and_anything_else_is_a_new_segment(tok):
    traj = AgentTrajectory(tok, MessageEncoder(tok))
    call = tok('<tool_call>\n{"name": "calc", "arguments": {"x": 1}}\n</tool_call>', add_special_tokens=False)
    calls = [{"id": "call_1", "type": "function", "function": {"name": "calc", "arguments": '{"x": 1}'}}]
    msgs = [{"role": "user", "content": "Q?"}]
    p1, m1 = _turn(traj, tok, msgs, call["input_ids"], TOOLS, calls)
    assert "<tools>" in tok.decode(p1)  # the template takes no tools=: stated in a system prompt
    back = msgs + [{"role": "assistant", "tool_calls": [dict(calls[0], id="other")]},  # ids may differ
                   {"role": "tool", "tool_call_id": "call_1", "content": "7"}]
    p2, _ = _turn(traj, tok, back, [5], TOOLS)
    assert len(traj.segments) == 1 and p2[:len(p1) + len(call["input_ids"])] == p1 + call["input_ids"]
    n = len(traj.current.history)
    edited = back + [{"role": "assistant", "content": "x"}, {"role": "user", "content": "again"}]
    edited[1] = {"role": "assistant", "content": "I changed my mind."}  # a rewritten answer
    _turn(traj, tok, edited, [6], TOOLS)
    assert len(traj.segments) == 2 and n == 4
    same = edited + [{"role": "assistant", "content": tok.decode([6], skip_special_tokens=True)},
                     {"role": "user", "content": "go"}]
    _turn(traj, tok, same, [7], None)  # other tools (none): a new segment
    assert len(traj.segments) == 3
    traj.completion_prompt([1, 2, 3])  # another endpoint: a new segment once recorded
    with pytest.raises(AgentRequestError, match="role must be one of"):
        traj.chat_prompt([{"role": "robot", "content": "x"}], None, None)


def test_each_segment_keeps_the_versions_of_its_own_calls(tok):
    """Streaming: weights may change between calls; each call's version is kept (agent.to_rollout),
    a segment holds its own calls', and the trained samples' adapter versions are their oldest."""
    from grpo_dist.data import make_task
    from grpo_dist.rollout.agent import to_rollout

    traj = AgentTrajectory(tok, MessageEncoder(tok))
    msgs = [{"role": "user", "content": "Q?"}]
    _, m1 = _turn(traj, tok, msgs, [5, 6])
    _turn(traj, tok, msgs + [m1, {"role": "user", "content": "More?"}], [7])  # extends: segment 1, call 2
    _turn(traj, tok, [{"role": "user", "content": "Summary."}], [8])  # a new segment: call 3
    rec = make_task("add", 1, seed=0)[0]
    out = to_rollout(tok, rec, [1, 2], traj, 3, "done", None, 9, versions=[3, 4, 5])
    assert out.weight_versions == [3, 4, 5] and out.adapter_version == 3
    (first,) = out.segments
    assert first.weight_versions == [3, 4] and first.adapter_version == 3
    batch = to_rollout(tok, rec, [1, 2], traj, 3, "done", None, 9)  # the batch pipeline: the call's version
    assert batch.weight_versions == [9, 9, 9] and batch.segments[0].weight_versions == [9, 9]
