"""One trajectory's bookkeeping without an engine (grpo_dist/rollout/trajectory.py): the text an
environment reads, the stop reasons, the sanity check, on the byte-level BPE tokenizer of
tests/bpe_model.py and hand-made samples (what an engine returns)."""

from __future__ import annotations

import pytest

from bpe_model import make_bpe_tokenizer
from grpo_dist.envs import EnvLimits
from grpo_dist.envs.base import run
from grpo_dist.envs.builtin import CalculatorEnv
from grpo_dist.rollout.base import Sample, SamplingSpec
from grpo_dist.rollout.trajectory import Trajectory, encoder_for, open_trajectory, sanity, turn_spec
from grpo_dist.types import PromptRecord

CALL = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "12*7"}}\n</tool_call>'


@pytest.fixture(scope="module")
def bpe_tok():
    return make_bpe_tokenizer()


def _sample(tok, text: str, end: list[int], finish: str = "stop") -> Sample:
    ids = tok(text, add_special_tokens=False)["input_ids"] + end
    return Sample(ids, tok.decode(ids, skip_special_tokens=True), [-0.5] * len(ids), finish)


def test_a_tool_call_written_in_special_tokens_reaches_the_parser():
    """Models whose tool-call tags are special tokens (Hermes-2-Pro style): the environment reads
    what the model wrote, special tokens included; only the end-of-turn token is left out."""
    tok = make_bpe_tokenizer()
    tok.add_special_tokens({"additional_special_tokens": ["<tool_call>", "</tool_call>"]})
    env = CalculatorEnv(system_prompt=None, limits=EnvLimits(max_parallel_calls=2))
    env.reset(PromptRecord(0, "q", {"answer": "84"}))
    t = Trajectory(PromptRecord(0, "q"), [1, 2], None, env, None)
    sample = _sample(tok, CALL, [tok.eos_token_id])
    assert tok.decode(sample.token_ids, skip_special_tokens=True).count("<tool_call>") == 0  # what was parsed
    cut, text = t.take(sample, 16, SamplingSpec(n=1, max_tokens=16), EnvLimits(), tok)
    assert cut is None and text == CALL == t.transcript[-1]["content"]
    step = run(env.step(text))
    assert step.info["tool_calls"] == 1 and [m["content"] for m in step.messages] == ["84"]


def test_env_sanity_of_a_trajectory_that_ends_on_environment_tokens(bpe_tok):
    """A trajectory stopped after a tool turn (its clock ran out) ends on the tool result and the
    next assistant header: a faithful build, no mismatch to report; nor after a final answer."""
    tok = bpe_tok
    env = CalculatorEnv(system_prompt="Use the calculator.", limits=EnvLimits())
    rec = PromptRecord(0, "q", {"question": "What is 12*7?", "answer": "84"})
    t = open_trajectory(tok, rec, [], None, env, env.reset(rec))
    lim = EnvLimits(sanity=True)
    cut, text = t.take(_sample(tok, CALL, []), 48, SamplingSpec(n=1, max_tokens=48), lim, tok)
    assert t.advance(cut, text, run(env.step(text)), lim, tok, encoder_for(tok), 1024)
    assert t.mask[-1] == 0 and tok.decode(t.ids).endswith("<|im_start|>assistant\n")
    t.stop_reason = "timeout"
    assert sanity(tok, t) == -1
    t.take(_sample(tok, "The answer is 84.", [tok.eos_token_id]), 48, SamplingSpec(n=1, max_tokens=48), lim, tok)
    t.stop_reason = "done"
    assert sanity(tok, t) == -1


def test_a_full_context_ends_the_trajectory_without_a_request(bpe_tok):
    """An opening that fills model.max_model_len: the trajectory ends as ``context`` before any
    engine request (a 1-token request over a full context makes vLLM reject the whole batch)."""
    spec, lim = SamplingSpec(n=1, max_tokens=8), EnvLimits(max_total_tokens=20)
    full = Trajectory(PromptRecord(0, "q"), list(range(3, 67)), None, CalculatorEnv(), None)
    assert turn_spec(full, spec, lim, 64) is None and full.stop_reason == "context"
    spent = Trajectory(PromptRecord(0, "q"), [3, 4], None, CalculatorEnv(), None, ids=[5] * 20, mask=[1] * 20)
    assert turn_spec(spent, spec, lim, 64) is None and spent.stop_reason == "budget"
    one = Trajectory(PromptRecord(0, "q"), list(range(3, 66)), None, CalculatorEnv(), None)
    assert turn_spec(one, spec, lim, 64).max_tokens == 1 and one.stop_reason is None


def test_one_set_of_stop_reasons_and_an_engine_abort_is_not_stop(bpe_tok):
    from vllm.outputs import CompletionOutput

    from grpo_dist.rollout.vllm_engine import to_sample
    from grpo_dist.types import LENGTH_STOPS, StopReason

    assert [str(s) for s in StopReason] == ["done", "length", "budget", "context", "max_turns", "timeout",
                                            "env_error", "abort"]
    assert f"rollout/stop_reason/{StopReason.MAX_TURNS}" == "rollout/stop_reason/max_turns"
    assert StopReason.DONE == "done" and set(LENGTH_STOPS) == {"length", "budget", "context"}
    aborted = CompletionOutput(index=0, text="12", token_ids=[5, 6], cumulative_logprob=None, logprobs=None,
                               finish_reason="abort")
    sample = to_sample(aborted)
    assert sample.finish_reason == "abort"
    t = Trajectory(PromptRecord(0, "q"), [1, 2], None, CalculatorEnv(), None)
    cut, _ = t.take(sample, 8, SamplingSpec(n=1, max_tokens=8), EnvLimits(), bpe_tok)
    assert cut == StopReason.ABORT


def test_every_turns_weight_version_is_kept_and_staleness_counts_from_the_oldest(bpe_tok):
    """Weights may change between the turns of a streaming trajectory: the Rollout keeps each
    turn's version (as slime's samples do) and its adapter_version, the one the staleness bound
    checks, is the oldest."""
    from grpo_dist.batch import staleness_metrics
    from grpo_dist.rollout.trajectory import to_rollout
    from grpo_dist.types import StopReason

    t = Trajectory(PromptRecord(0, "q"), [1, 2], None, CalculatorEnv(), None)
    for v in (3, 4, 5):
        t.take(_sample(bpe_tok, "7", [bpe_tok.eos_token_id]), 8, SamplingSpec(n=1, max_tokens=8), EnvLimits(),
               bpe_tok, v)
    t.stop_reason = StopReason.MAX_TURNS
    r = to_rollout(bpe_tok, t, 5, False)
    assert r.weight_versions == [3, 4, 5] and r.adapter_version == 3 and r.stop_reason == "max_turns"
    with pytest.raises(ValueError, match=r"staleness must lie in \[0, 1\]"):
        staleness_metrics([r.adapter_version], 5, 1)
    assert staleness_metrics([r.adapter_version], 5, 2)["rollout/staleness_max"] == 2.0
