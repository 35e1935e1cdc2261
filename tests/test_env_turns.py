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
from grpo_dist.rollout.trajectory import Trajectory
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

