"""What agent frameworks send to the endpoint (issue 43): streamed answers (chat and completions,
usage included), log-probs, tool_choice required or naming a function, parallel_tool_calls false.
A real worker (transformers backend, the tiny model over a byte-level BPE vocabulary), the
``wire`` agent of tests/agent_helpers.py through the openai SDK.

* a streamed answer is the recorded one: its text is the decoded sampled tokens, its log-probs and
  token ids are the behaviour log-probs and ids the trainer gets, usage counts them;
* log-probs returned are the recorded behaviour log-probs;
* tool_choice required samples again (a new request of the trajectory, trained too) while no call
  comes, at most TOOL_RETRIES more times; every attempt is in the batch.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bpe_model import agent_worker
from grpo_dist.data import make_task
from grpo_dist.rollout.agent_server import TOOL_RETRIES

HELPERS = Path(__file__).parent / "agent_helpers.py"


@pytest.fixture(scope="module")
def wired(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("wire")
    log = tmp / "log.jsonl"
    with agent_worker(tmp, f"{HELPERS}:wire", max_turns=12) as w:
        groups = w.generate(make_task("add", 1, seed=5, split="eval"), keys=[(1, 1, 0)])
        yield [json.loads(x) for x in log.read_text().splitlines()], [r for g in groups for r in g.rollouts], w


def _samples(r):
    """Each request's sampled ids and behaviour log-probs, in order, from the trained rollout."""
    out = []
    for s in [r] + list(r.segments or []):
        ids, lps, mask = s.completion_ids, s.logprobs, s.loss_mask
        i = 0
        while i < len(ids):
            if mask[i]:
                j = i
                while j < len(ids) and mask[j]:
                    j += 1
                out.append((list(ids[i:j]), list(lps[i:j])))
                i = j
            else:
                i += 1
    return out


def _paired(seen, rollouts):
    """Each agent's log with its trajectory (the one holding its first call's tokens)."""
    return [(log, next(r for r in rollouts if log["plain"]["ids"] in [i for i, _ in _samples(r)])) for log in seen]


def test_logprobs_and_streamed_answers_are_the_recorded_tokens(wired):
    seen, rollouts, w = wired
    assert len(seen) == 2 and all(r.stop_reason != "env_error" for r in rollouts), [r.error for r in rollouts]
    tok = w.engine.tokenizer
    for log, r in _paired(seen, rollouts):
        samples = _samples(r)
        plain, streamed = log["plain"], log["streamed"]
        assert (plain["ids"], plain["lps"]) in [(ids, pytest.approx(lps)) for ids, lps in samples]
        assert plain["text"] == tok.decode(plain["ids"], skip_special_tokens=True)
        assert plain["tops"] == [1] * len(plain["ids"])  # the sampled token: the engine records no other
        assert streamed["ids"] and (streamed["ids"], streamed["lps"]) in [(i, pytest.approx(lp)) for i, lp in samples]
        assert streamed["text"] == tok.decode(streamed["ids"], skip_special_tokens=True)
        assert streamed["usage"] == len(streamed["ids"]) and streamed["finish"] in ("stop", "length")
        assert log["completion"]  # a streamed completion's pieces make its text


def test_tool_choice_required_samples_again_and_trains_every_attempt(wired):
    seen, rollouts, _ = wired
    for log, r in _paired(seen, rollouts):
        calls = len(_samples(r))
        # plain + streamed + completion + the required call's attempts + the named call's attempts
        attempts = calls - 3
        req_finish, req_calls = log["required"]
        named_finish, named_calls = log["named"]
        assert named_calls <= 1  # parallel_tool_calls false: one call at most
        need = (1 if req_calls else 1 + TOOL_RETRIES) + (1 if named_calls else 1 + TOOL_RETRIES)
        assert attempts == need, (attempts, log)  # a sample per attempt, each in the batch
        assert (req_finish == "tool_calls") == bool(req_calls)
        assert (named_finish == "tool_calls") == bool(named_calls)


@pytest.fixture(scope="module")
def responded(wired, tmp_path_factory):
    """The same worker, the ``responses`` agent (the Responses API, as the OpenAI Agents SDK calls it)."""
    from grpo_dist.rollout.agent import AgentRollouts

    _, _, w = wired
    log = tmp_path_factory.mktemp("responses") / "log.jsonl"
    w.agent.close()
    w.agent = AgentRollouts(w.cfg.rollout.model_copy(update={"agent": f"{HELPERS}:responses",
                                                             "agent_kwargs": {"log": str(log)}}),
                            Path(str(w.cfg.model.path)).name)
    groups = w.generate(make_task("add", 1, seed=6, split="eval"), keys=[(2, 1, 0)])
    return [json.loads(x) for x in log.read_text().splitlines()], [r for g in groups for r in g.rollouts]


def test_the_responses_api_samples_records_and_extends_through_previous_response_id(responded):
    seen, rollouts = responded
    assert len(seen) == 2 and all(r.stop_reason != "env_error" for r in rollouts), [r.error for r in rollouts]
    for r in rollouts:
        samples = _samples(r)
        assert len(samples) == 4  # four calls, each sampled and recorded
        # r1 and r2 (previous_response_id) are one segment; r3's and r4's fresh inputs start others
        assert len([r] + list(r.segments or [])) == 3
    assert all(st in ("completed", "incomplete") for log in seen for st, _, _, _ in log["rs"])
    for log in seen:  # streamed: the API's events in order; the deltas make the completed response's text
        kinds, text = log["streamed"]
        assert kinds[0] == "response.created" and kinds[-1] in ("response.completed", "response.incomplete")
        assert kinds.count("response.output_item.added") == kinds.count("response.output_item.done") >= 1
        assert text == log["rs"][3][1]
    # usage.output_tokens of every response = the tokens recorded for it
    assert sorted(n for log in seen for _, _, n, _ in log["rs"]) == sorted(
        len(ids) for r in rollouts for ids, _ in _samples(r))
