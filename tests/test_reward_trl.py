"""TRL's reward interface: keyword calls, None = "not applicable", conversational inputs, every
dataset column under its own name, ``trainer_state``, concurrent ``async def`` rewards."""

from __future__ import annotations

import json
import textwrap
import time

import pytest

from grpo_dist.config import RewardConfig, RewardFnConfig
from grpo_dist.data import load_prompts
from grpo_dist.reward import RewardWorker
from grpo_dist.reward.columns import required_columns
from grpo_dist.reward.registry import get_reward_fn
from grpo_dist.reward.worker import score_inputs
from grpo_dist.types import PROMPT_MESSAGES, RewardState, Rollout

FAIL = -1.0

# Written the way TRL's documentation writes reward functions (GRPOTrainer docs, "Using a custom
# reward function"): keyword arguments, conversational completions, **kwargs for the rest.
TRL_DOCS_REWARDS = '''
import asyncio
import re


def format_reward_func(completions, **kwargs):
    """Reward function that checks if the completion has a specific format."""
    pattern = r"^<think>.*?</think><answer>.*?</answer>$"
    completion_contents = [completion[0]["content"] for completion in completions]
    matches = [re.match(pattern, content) for content in completion_contents]
    return [1.0 if match else 0.0 for match in matches]


def reward_func(completions, ground_truth, **kwargs):
    # Regular expression to capture content inside \\boxed{}
    matches = [re.search(r"\\\\boxed\\{(.*?)\\}", completion[0]["content"]) for completion in completions]
    contents = [match.group(1) if match else "" for match in matches]
    # Reward 1 if the content is the same as the ground truth, 0 otherwise
    return [1.0 if c == gt else 0.0 for c, gt in zip(contents, ground_truth)]


def seen(prompts, completions, completion_ids, trainer_state, **kwargs):
    SEEN.append({"prompts": prompts, "completions": completions, "completion_ids": completion_ids,
                 "global_step": trainer_state.global_step, "kwargs": sorted(kwargs)})
    return [0.0] * len(completions)


def math_only(completions, task, **kwargs):
    """None where the reward does not apply (TRL: "not applicable to this sample")."""
    return [1.0 if t == "math" else None for t in task]


async def slow_a(completions, **kwargs):
    await asyncio.sleep(1.0)
    return [0.5] * len(completions)


async def slow_b(completions, **kwargs):
    await asyncio.sleep(1.0)
    return [0.25] * len(completions)


async def hangs(completions, **kwargs):
    await asyncio.sleep(30)
    return [1.0] * len(completions)


SEEN = []
'''


@pytest.fixture
def trl_module(tmp_path):
    path = tmp_path / "trl_rewards.py"
    path.write_text(textwrap.dedent(TRL_DOCS_REWARDS))
    return path


def _worker(path, *names, timeout_s=5.0, weights=None) -> RewardWorker:
    fns = [RewardFnConfig(fn=f"{path}:{n}", weight=(weights or {}).get(n, 1.0)) for n in names]
    return RewardWorker(RewardConfig(functions=fns, timeout_s=timeout_s, failure_reward=FAIL))


def _rollout(prompt_messages, text, columns, version=3):
    cols = dict(columns)
    if prompt_messages is not None:
        cols[PROMPT_MESSAGES] = prompt_messages
    return Rollout(prompt_id=0, prompt="user: hi\nassistant: ", prompt_ids=[1, 2], completion=text,
                   completion_ids=[ord(c) for c in text], logprobs=[0.0] * len(text), finish_reason="stop",
                   adapter_version=version, columns=cols)


def test_trl_docs_rewards_run_unchanged_on_conversational_rollouts(trl_module):
    msgs = [{"role": "user", "content": "What is 2+2?"}]
    rollouts = [_rollout(msgs, "<think>t</think><answer>\\boxed{4}</answer>", {"ground_truth": "4"}),
                _rollout(msgs, "5", {"ground_truth": "4"})]
    w = _worker(trl_module, "format_reward_func", "reward_func")
    res = w.score(*score_inputs(rollouts))
    assert res.per_function == {"format_reward_func": [1.0, 0.0], "reward_func": [1.0, 0.0]}
    assert res.total == [2.0, 0.0] and res.errors == {"format_reward_func": 0, "reward_func": 0}


def test_rewards_get_what_trl_gives_them(trl_module):
    msgs = [{"role": "system", "content": "Add."}, {"role": "user", "content": "2+2="}]
    rollouts = [_rollout(msgs, "4", {"answer": "4", "level": 1}, version=5),
                _rollout(msgs, "5", {"answer": "4", "level": 1}, version=6)]
    w = _worker(trl_module, "seen")
    w.score(*score_inputs(rollouts))
    mod = __import__("sys").modules[get_reward_fn(f"{trl_module}:seen").__module__]
    (call,) = mod.SEEN
    assert call["prompts"] == [msgs, msgs]  # the conversation the model was given
    assert call["completions"] == [[{"role": "assistant", "content": "4"}], [{"role": "assistant", "content": "5"}]]
    assert call["completion_ids"] == [[ord("4")], [ord("5")]]
    assert call["global_step"] == 6  # updates behind the newest policy that generated the batch
    assert call["kwargs"] == ["answer", "level"]  # dataset columns; never the pipeline's own keys
    plain = [_rollout(None, "4", {"answer": "4"})]  # a plain-text prompt: strings, as in TRL
    w.score(*score_inputs(plain))
    assert mod.SEEN[1]["prompts"] == ["user: hi\nassistant: "] and mod.SEEN[1]["completions"] == ["4"]


def test_none_is_not_applicable_left_out_of_the_weighted_sum(trl_module, tmp_path):
    """total[i] = sum over the functions f whose value v_f[i] is not None of weight_f * v_f[i]
    (0.0 when every function returned None for completion i, as TRL's nansum)."""
    extra = tmp_path / "extra.py"
    extra.write_text("def half(completions, **kw):\n    return [0.5, None, 0.5]\n")
    fns = [RewardFnConfig(fn=f"{trl_module}:math_only", weight=2.0), RewardFnConfig(fn=f"{extra}:half", weight=0.1)]
    w = RewardWorker(RewardConfig(functions=fns, failure_reward=FAIL))
    res = w.score(["p"] * 3, ["a", "b", "c"], {"task": ["math", "code", "code"]})
    assert res.per_function == {"math_only": [1.0, None, None], "half": [0.5, None, 0.5]}
    assert res.total == pytest.approx([2.0 + 0.05, 0.0, 0.05])
    assert res.errors == {"math_only": 0, "half": 0}  # None is no failure


def test_async_rewards_run_concurrently_and_time_out_alone(trl_module):
    w = _worker(trl_module, "slow_a", "slow_b", "format_reward_func")
    conv = [[{"role": "assistant", "content": "x"}]] * 2
    t0 = time.monotonic()
    res = w.score(["p", "p"], conv, {})
    took = time.monotonic() - t0
    assert res.per_function["slow_a"] == [0.5, 0.5] and res.per_function["slow_b"] == [0.25, 0.25]
    assert took < 1.7, took  # one after the other would take 2.0 s
    w = _worker(trl_module, "hangs", "slow_a", timeout_s=1.5)
    t0 = time.monotonic()
    res = w.score(["p"], [[{"role": "assistant", "content": "x"}]], {})
    assert time.monotonic() - t0 < 3.0
    assert res.errors == {"hangs": 1, "slow_a": 0} and res.per_function["hangs"] == [FAIL]
    assert res.reasons["hangs"].startswith("timed out after 1.5")
    assert "asyncio.sleep(30)" in res.tracebacks["hangs"]  # where the coroutine was stuck
    again = w.score(["p"], [[{"role": "assistant", "content": "x"}]], {})  # the loop is still usable
    assert again.per_function["slow_a"] == [0.5]


def test_keyword_and_positional_plugins_and_required_columns(trl_module, tmp_path):
    assert required_columns("x", get_reward_fn(f"{trl_module}:reward_func"), "k") == {"ground_truth"}
    assert required_columns("x", get_reward_fn(f"{trl_module}:format_reward_func"), "k") == set()
    assert required_columns("x", get_reward_fn(f"{trl_module}:seen"), "k") == {"completion_ids", "trainer_state"}
    legacy = tmp_path / "legacy.py"  # the house's older positional form keeps working
    legacy.write_text("def f(p, c, **kw):\n    return [float(len(x)) for x in c]\n"
                      "def named(prompts, completions, answer):\n    return [float(a == x) for a, x in zip(answer, completions)]\n")
    w = RewardWorker(RewardConfig(functions=[RewardFnConfig(fn=f"{legacy}:f"), RewardFnConfig(fn=f"{legacy}:named")]))
    res = w.score(["p", "p"], ["ab", "4"], {"answer": ["4", "4"], "other": [1, 2]})
    assert res.per_function == {"f": [2.0, 1.0], "named": [0.0, 1.0]}  # no **kwargs: only the columns it names
    assert res.errors == {"f": 0, "named": 0}


def test_every_dataset_column_keeps_its_own_name_and_messages_are_kept(tmp_path):
    from grpo_dist.models import build_tokenizer

    rows = [{"question": [{"role": "user", "content": "1+1="}], "solution": "2", "level": 1}]
    path = tmp_path / "d.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    (rec,) = load_prompts(str(path), prompt_column="question", answer_column="solution", chat_template=True,
                          tokenizer=build_tokenizer(), system_prompt="S")
    assert rec.columns["solution"] == "2" and rec.columns["answer"] == "2" and rec.columns["level"] == 1
    assert rec.columns[PROMPT_MESSAGES] == [{"role": "system", "content": "S"}, {"role": "user", "content": "1+1="}]
    assert "question" not in rec.columns  # the prompt is the prompts argument, as in TRL
    (plain,) = load_prompts(str(path), prompt_column="question", answer_column="solution", chat_template=True,
                            tokenizer=build_tokenizer())
    assert plain.columns[PROMPT_MESSAGES] == [{"role": "user", "content": "1+1="}]
    assert RewardState(global_step=2).global_step == 2
