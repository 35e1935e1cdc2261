"""A recorded base-model evaluation (run/eval_cache.py): its key changes with every input the
evaluation depends on and with nothing else (the training seed, the run's outputs, the schedule),
a record is found again under the same key, and `GRPO_DIST_EVAL_CACHE=off` or `eval.reuse_base:
false` evaluates every time. The end-to-end reuse (a training records, `grpo-dist eval` reuses):
tests/test_e2e.py."""

from __future__ import annotations

import os
import time

import pytest

from grpo_dist.config import load_config
from grpo_dist.run import eval_cache
from grpo_dist.types import PromptRecord
from e2e import DEMO


@pytest.fixture
def setup(tmp_path, monkeypatch):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text('{"model_type": "llama"}')
    (model / "model.safetensors").write_bytes(b"w" * 64)
    plugin = tmp_path / "my_rewards.py"
    plugin.write_text("def brevity(prompts, completions, **kw):\n    return [0.0] * len(completions)\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(eval_cache.CACHE_ENV, str(tmp_path / "evals"))

    def cfg(**sections):
        base = {"model": {"path": str(model), "make_if_missing": None},
                "reward": {"functions": [{"fn": "correctness"}, {"fn": "my_rewards.py:brevity", "weight": 0.1}]}}
        for k, v in sections.items():
            base.setdefault(k, {}).update(v)
        return load_config(DEMO, base)

    records = [PromptRecord(i, f"{i}+1=", {"answer": str(i + 1)}) for i in range(4)]
    extra = {"ood": [PromptRecord(0, "one plus one", {"answer": "2"})]}
    return cfg, records, extra, model, plugin


def test_the_key_changes_with_each_input_and_only_with_those(setup, monkeypatch):
    cfg, records, extra, model, plugin = setup
    key = lambda c=None, r=records, x=extra: eval_cache.key_of(eval_cache.key_inputs(c or cfg(), r, x))
    base = key()
    assert base == key()  # the same inputs, the same key
    same = [cfg(trainer={"seed": 7, "steps": 3}), cfg(rollout={"num_workers": 1, "group_size": 4}),
            cfg(algo={"preset": "dapo"}), cfg(eval={"before": False}), cfg(logging={"wandb_mode": "disabled"}),
            load_config(DEMO, {"model": {"path": str(model), "make_if_missing": None}, "output_dir": "runs/x",
                               "reward": cfg().reward.model_dump()}),
            cfg(model={"path": "model/"}),  # the same directory, relative (the test runs in its parent)
            cfg(model={"make_if_missing": {"size": "small"}})]  # generates only where no model is
    for c in same:
        assert key(c) == base
    changed = {
        "eval temperature": key(cfg(eval={"temperature": 0.5})),
        "samples per prompt": key(cfg(eval={"samples_per_prompt": 8})),
        "greedy": key(cfg(eval={"greedy": False})),
        "max_tokens": key(cfg(rollout={"max_tokens": 9})),
        "top_p": key(cfg(rollout={"top_p": 0.9})),
        "engine dtype": key(cfg(rollout={"dtype": "bfloat16"})),
        "model dtype": key(cfg(model={"dtype": "bfloat16"})),
        "max_model_len": key(cfg(model={"max_model_len": 48})),
        "reward weight": key(cfg(reward={"functions": [{"fn": "correctness", "weight": 2.0}]})),
        "a prompt": key(r=[PromptRecord(0, "0+2=", {"answer": "2"}), *records[1:]]),
        "an answer": key(r=[PromptRecord(0, "0+1=", {"answer": "2"}), *records[1:]]),
        "an extra set": key(x={"ood": [PromptRecord(0, "one plus two", {"answer": "3"})]}),
        "no extra set": key(x={}),
        "rollout cpus": key(cfg(cluster={"rollout_cpus": 0.25})),
    }
    with monkeypatch.context() as m:
        m.setattr("grpo_dist.run.evaluation.EVAL_SEED", 99)
        changed["eval seed"] = key()
    with monkeypatch.context() as m:
        m.setattr("grpo_dist.__version__", "9.9")
        changed["grpo_dist version"] = key()
    plugin.write_text(plugin.read_text() + "# changed\n")
    changed["plug-in file"] = key()
    (model / "model.safetensors").write_bytes(b"w" * 65)
    changed["weights file"] = key()
    os.utime(model / "model.safetensors", ns=(time.time_ns(), time.time_ns() + 10**9))
    changed["weights mtime"] = key()
    assert [k for k, v in changed.items() if v == base] == [] and len(set(changed.values())) == len(changed), changed


def test_a_record_is_reused_once_made_and_never_when_off(setup, monkeypatch, tmp_path):
    cfg, records, extra, *_ = setup
    calls, lines = [], []

    def evaluate(samples):
        calls.append(samples)
        return {"sampled_accuracy": 0.25, "mean_reward": 0.5, "num_prompts": 4, "samples": [{"prompt": "0+1="}],
                "extra": {"ood": {"sampled_accuracy": 0.0, "mean_reward": 0.0}}}

    first = eval_cache.base_evaluation(cfg(), records, extra, evaluate, "grpo-dist eval", lines.append)
    assert calls == [eval_cache.SAMPLES] and lines == [] and "reused_from" not in first
    again = eval_cache.base_evaluation(cfg(trainer={"seed": 3}), records, extra, evaluate, "grpo-dist train",
                                       lines.append)
    assert calls == [eval_cache.SAMPLES]  # not evaluated again: another training seed, the same evaluation
    path = next((tmp_path / "evals").glob("*.json"))
    assert lines == [f"base-model evaluation reused from {path} (same model, sets, seed, sampling): "
                     f"sampled accuracy 0.250; ood: sampled accuracy 0.000"]
    assert again == {**first, "reused_from": str(path)}
    assert eval_cache.without_samples(again) == {k: v for k, v in again.items() if k != "samples"}
    eval_cache.base_evaluation(cfg(eval={"reuse_base": False}), records, extra, evaluate, "t", lines.append)
    monkeypatch.setenv(eval_cache.CACHE_ENV, "off")
    eval_cache.base_evaluation(cfg(), records, extra, evaluate, "t", lines.append)
    assert len(calls) == 3 and len(lines) == 1
    # a report with reward errors is not recorded (a timeout would be replayed)
    monkeypatch.setenv(eval_cache.CACHE_ENV, str(tmp_path / "other"))
    bad = lambda n: {"sampled_accuracy": 0.0, "mean_reward": 0.0, "reward_errors": {"math": 3}}
    eval_cache.base_evaluation(cfg(), records, extra, bad, "t", lines.append)
    assert not (tmp_path / "other").exists() or not list((tmp_path / "other").glob("*.json"))
