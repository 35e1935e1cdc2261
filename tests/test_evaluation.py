"""Evaluation follows the data and the configured rewards: which rewards score an eval set,
accuracy from the reference-checking rewards, an eval set without answers (no Ray here: the
reward worker is the real class, called in-process)."""

from __future__ import annotations

import pytest

from grpo_dist.config import config_from_dict
from grpo_dist.reward.columns import EvalPlan, check_rewards, plan_eval
from grpo_dist.run.evaluation import eval_metrics, summarise
from grpo_dist.reward import RewardWorker
from grpo_dist.data import PromptRecord
from grpo_dist.types import Rollout, RolloutGroup


def _cfg(functions):
    return config_from_dict({"reward": {"functions": functions}, "logging": {"wandb_mode": "disabled"}})


def _groups(rows, completions):
    out = []
    for i, (row, comps) in enumerate(zip(rows, completions)):
        out.append(RolloutGroup(prompt_id=i, rollouts=[
            Rollout(prompt_id=i, prompt=row.prompt, prompt_ids=[1], completion=c, completion_ids=[2] * len(c),
                    logprobs=[0.0] * len(c), finish_reason="stop", adapter_version=0, columns=row.columns)
            for c in comps]))
    return out


def _score(cfg, plan, groups):
    flat = [r for g in groups for r in g.rollouts]
    cols = {k: [r.columns.get(k) for r in flat] for k in sorted({k for r in flat for k in r.columns})}
    cols["completion_ids"] = [r.completion_ids for r in flat]
    return RewardWorker(cfg.reward).score([r.prompt for r in flat], [r.completion for r in flat], cols,
                                          functions=plan.used)


GSM = [PromptRecord(0, "Q: 48 + 24?", {"answer": "72"}), PromptRecord(1, "Q: 3/4 of 8?", {"answer": "6"})]
NO_ANSWERS = [PromptRecord(0, "Write a haiku", {"topic": "sea"}), PromptRecord(1, "Write a limerick", {"topic": "cat"})]
FUNCS = [{"fn": "math"}, {"fn": "format", "weight": 0.5}]


def test_plan_with_answers_uses_every_reward_and_accuracy_from_math():
    plan = plan_eval(check_rewards(_cfg(FUNCS)), GSM)
    assert plan == EvalPlan(used=["math", "format"], skipped={}, accuracy=["math"])
    assert plan.describe() is None


def test_plan_without_answers_skips_the_rewards_that_need_them_and_says_so():
    plan = plan_eval(check_rewards(_cfg(FUNCS + [{"fn": "correctness"}])), NO_ANSWERS)
    assert plan.used == ["format"] and plan.accuracy == []
    assert plan.skipped == {"math": ["answer"], "correctness": ["answer"]}
    msg = plan.describe()
    assert "math needs 'answer'" in msg and "scoring with format only" in msg and "no accuracy" in msg


def test_plan_without_any_reference_reward():
    plan = plan_eval(check_rewards(_cfg([{"fn": "format"}, {"fn": "length", "kwargs": {"max_len": 50}}])), GSM)
    assert plan.used == ["format", "length"] and plan.accuracy == [] and plan.skipped == {}
    assert "no configured reward checks a reference answer" in plan.describe()


def test_summary_accuracy_and_rewards_from_the_configured_rewards():
    cfg = _cfg(FUNCS)
    plan = plan_eval(check_rewards(cfg), GSM)
    groups = _groups(GSM, [["<think>48+24</think><answer>72</answer>", "#### 70"],
                           ["so \\boxed{6}", "<think>x</think><answer>6.0</answer>"]])
    out, correct = summarise(plan, groups, _score(cfg, plan, groups))
    assert correct == [[1.0, 0.0], [1.0, 1.0]]
    assert out["accuracy"] == 0.75
    assert out["reward_means"] == {"math": 0.75, "format": pytest.approx((1.0 + 0.0 + 0.0 + 1.0) / 4)}
    assert out["mean_reward"] == pytest.approx((1.5 + 0.0 + 1.0 + 1.5) / 4)


def test_summary_without_answers_reports_rewards_only():
    cfg = _cfg(FUNCS)
    plan = plan_eval(check_rewards(cfg), NO_ANSWERS)
    groups = _groups(NO_ANSWERS, [["<think>a</think><answer>b</answer>", "plain"], ["<answer>x</answer>", ""]])
    scores = _score(cfg, plan, groups)
    assert set(scores.per_function) == {"format"} and scores.errors == {"format": 0}  # math never called
    out, correct = summarise(plan, groups, scores)
    assert correct is None and "accuracy" not in out
    assert out["reward_means"] == {"format": pytest.approx((1.0 + 0.0 + 0.4 + 0.0) / 4)}
    metrics = eval_metrics({**out, "mean_reward": out["mean_reward"]})
    assert set(metrics) == {"eval/mean_reward", "eval/reward/format"}


def test_preflight_eval_set_without_answers(tmp_path, tiny_model_dir):
    """An eval set without answers passes pre-flight when some configured reward needs none;
    with only answer-checking rewards it is a one-line config error."""
    import json

    from grpo_dist.run import preflight
    from grpo_dist.config import ConfigError

    train = tmp_path / "train.jsonl"
    train.write_text("".join(json.dumps({"prompt": f"{i}+1=", "answer": str(i + 1)}) + "\n" for i in range(8)))
    noans = tmp_path / "noans.jsonl"
    noans.write_text("".join(json.dumps({"prompt": f"{i}+2="}) + "\n" for i in range(4)))
    base = {"model": {"path": str(tiny_model_dir), "max_model_len": 64}, "rollout": {"max_tokens": 6},
            "data": {"path": str(train), "eval_path": str(noans)}, "logging": {"wandb_mode": "disabled"},
            "output_dir": str(tmp_path / "out")}
    ok = config_from_dict({**base, "reward": {"functions": [{"fn": "correctness"}, {"fn": "format"}]}})
    train_recs, evals = preflight.prepared_data(ok, log_fn=lambda m: None)
    assert len(train_recs) == 8 and len(evals) == 4
    bad = config_from_dict({**base, "reward": {"functions": [{"fn": "correctness"}]}})
    with pytest.raises(ConfigError, match=r"data\.eval_path: reward function 'correctness' needs column 'answer'"):
        preflight.check(bad, log_fn=lambda m: None)


@pytest.mark.slow
def test_eval_cli_on_a_dataset_without_answers(tmp_path, pretrained_model_dir):
    """`grpo-dist eval` (real Ray + vLLM) on prompts without answers, with correctness + format +
    length configured: scored on format and length, correctness named as skipped, no accuracy."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    data = tmp_path / "noans.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"{i}+{i + 1}="}) + "\n" for i in range(12)))
    report_path = tmp_path / "report.json"
    rewards = json.dumps([{"fn": "correctness"}, {"fn": "format", "weight": 0.5},
                          {"fn": "length", "kwargs": {"min_len": 1, "max_len": 3}}])
    r = subprocess.run(
        [sys.executable, "-m", "grpo_dist.cli", "eval", "--config", str(root / "configs/tiny_cpu.yaml"),
         "--out", str(report_path), "--model.path", str(pretrained_model_dir), "--model.make_if_missing", "null",
         "--rollout.num_workers", "1", "--data.eval_path", str(data), "--data.eval_size", "8",
         "--reward.functions", rewards, "--output_dir", str(tmp_path), "--logging.wandb_mode", "disabled",
         "--eval.extra", '{"sums": "builtin:add?n=4"}'],  # a second set, with answers: accuracy there
        cwd=root, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    report = json.loads(report_path.read_text())
    base = report["base"]
    # eval.extra: evaluated by the same engines, its own plan (answers: correctness scores it), its own table
    sums = base["extra"]["sums"]
    assert sums["source"] == "builtin:add?n=4" and sums["num_prompts"] == 4 and report["eval_extra"] == {"sums": "builtin:add?n=4"}
    assert sums["accuracy_rewards"] == ["correctness"] and sums["rewards_skipped"] == {}
    assert 0.0 <= sums["sampled_accuracy"] <= 1.0 and "greedy_accuracy" in sums and "pass@1" in sums
    assert "sums: builtin:add?n=4" in r.stdout and "(4 prompts of sums, " in r.stdout
    assert base["rewards_used"] == ["format", "length"] and base["accuracy_rewards"] == []
    assert base["rewards_skipped"] == {"correctness": "needs column(s) answer"}
    assert "sampled_accuracy" not in base and "greedy_accuracy" not in base and "pass@1" not in base
    assert set(base["reward_means"]) == {"format", "length"} and base["num_prompts"] == 8
    assert 0.0 <= base["reward_means"]["length"] <= 1.0 and "greedy_mean_reward" in base
    assert base["mean_reward"] == pytest.approx(0.5 * base["reward_means"]["format"] + base["reward_means"]["length"])
    assert "scoring with format, length only" in r.stderr  # the log line says which


@pytest.mark.slow
def test_train_with_eval_before_false_evaluates_only_after_training(tmp_path, pretrained_model_dir):
    """``eval.before: false``: no evaluation of the base model, the one after training on every set
    (main and eval.extra), its figures in summary.json and on the console."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    out = tmp_path / "run"
    r = subprocess.run(
        [sys.executable, "-m", "grpo_dist.cli", "train", "--config", "configs/tiny_cpu.yaml",
         "--model.path", str(pretrained_model_dir), "--model.make_if_missing", "null", "--output_dir", str(out),
         "--rollout.backend", "hf", "--rollout.num_workers", "1", "--rollout.prompts_per_step", "2",
         "--rollout.group_size", "4", "--trainer.steps", "1", "--checkpoint.every", "0",
         "--logging.wandb_mode", "disabled", "--logging.progress", "false", "--eval.before", "false",
         "--data.eval_size", "4", "--eval.samples_per_prompt", "2", "--eval.pass_k", "[1, 2]",
         "--eval.extra", '{"sums": "builtin:add?n=4"}'],
        cwd=root, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    console = r.stdout + r.stderr
    assert "before training" not in console and "evaluating 4 held-out prompts + 4 sums after training" in console
    # a line per phase of each set: progress through a long evaluation
    assert "  held-out: 8 sampled completions in " in console and "  sums: 8 sampled completions in " in console
    summary = json.loads((out / "summary.json").read_text())
    assert "eval_before" not in summary and "sampled_accuracy_before" not in summary
    assert 0.0 <= summary["sampled_accuracy_after"] <= 1.0 and "greedy_accuracy_after" in summary
    assert set(summary["eval_sets"]["sums"]) == {"source", "sampled_accuracy_after", "greedy_accuracy_after",
                                                 "mean_reward_after"}
    assert f"sampled_accuracy   after {summary['sampled_accuracy_after']:.3f}" in console
