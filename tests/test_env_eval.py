"""Evaluation with a multi-turn environment (grpo_dist/run/evaluation.py): accuracy from the
environment's reward where no reward checks a reference column, and tool use (turns and tool calls
per trajectory, the fraction with a call, errors, stop reasons). Fast: a scripted tool environment
in an in-process worker; slow: ``grpo-dist eval`` on the calculator config through the CLI (the
demo's tiny model, transformers backend)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from grpo_dist.config import load_config
from grpo_dist.data import make_task
from grpo_dist.reward.columns import EvalPlan
from grpo_dist.rollout.worker import RolloutWorker
from grpo_dist.run.eval_table import eval_table
from grpo_dist.run.evaluation import eval_metrics, summarise, tool_use
from grpo_dist.types import RewardResult

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = f"{Path(__file__).parent / 'env_helpers.py'}:ToolScript"


def test_tool_use_and_accuracy_from_the_environment_reward(pretrained_model_dir):
    cfg = load_config(None, {"model": {"path": str(pretrained_model_dir)}, "lora": {"enabled": False},
                             "rollout": {"backend": "hf", "group_size": 4, "max_tokens": 6, "env": SCRIPT}})
    w = RolloutWorker(cfg)
    w.setup()
    try:
        groups = w.generate(make_task("add", 3, seed=7, split="eval"), keys=[(0, 1, i) for i in range(3)])
    finally:
        w.close()
    flat = [r for g in groups for r in g.rollouts]
    n = len(flat)
    t = tool_use(groups)
    assert t["turns_mean"] == pytest.approx(sum(r.turns for r in flat) / n)
    assert t["tool_calls_mean"] == pytest.approx(sum(r.columns["tool_calls"] for r in flat) / n)
    assert t["tool_errors_mean"] == pytest.approx(sum(r.columns["tool_errors"] for r in flat) / n)
    assert t["tool_use_frac"] == pytest.approx(sum(r.columns["tool_calls"] > 0 for r in flat) / n)
    calls = sum(r.columns["tool_calls"] for r in flat)
    assert calls > 0 and t["tool_call_ok_frac"] == pytest.approx(1 - sum(r.columns["tool_errors"] for r in flat) / calls)
    assert sum(t["stop_reasons"].values()) == n and set(t["stop_reasons"]) <= {"done", "length"}
    # no reward checks a reference column: a trajectory is correct when its environment gave >= 1
    scores = RewardResult(total=[0.0] * n, per_function={})
    out, correct = summarise(EvalPlan(used=[]), groups, scores)
    want = [[float((r.columns["env_reward"] or 0.0) >= 1.0) for r in g.rollouts] for g in groups]
    assert correct == want and out["accuracy"] == pytest.approx(sum(map(sum, want)) / n)
    m = eval_metrics({"mean_reward": 0.0, **t})
    assert m["eval/tool_calls_mean"] == t["tool_calls_mean"] and m["eval/turns_mean"] == t["turns_mean"]
    for g in groups:  # single turn: no tool-use keys, no accuracy without a reference-checking reward
        for r in g.rollouts:
            r.loss_mask = None
    assert tool_use(groups) == {} and summarise(EvalPlan(used=[]), groups, scores)[1] is None


@pytest.mark.slow
def test_grpo_dist_eval_runs_the_calculator_environment(pretrained_model_dir, tmp_path):
    # the calculator's opening (system prompt + tool schema) is ~1100 characters: the demo's tiny
    # model (character tokenizer, RoPE) gets a longer context for it
    model = tmp_path / "tiny"
    shutil.copytree(pretrained_model_dir, model)
    mcfg = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps(dict(mcfg, max_position_embeddings=2048)))
    out = tmp_path / "eval.json"
    r = subprocess.run(
        [sys.executable, "-m", "grpo_dist.cli", "eval", "--config", str(ROOT / "configs" / "calculator_smollm2.yaml"),
         "--model.path", str(model), "--model.max_model_len", "1536", "--rollout.backend", "hf",
         "--rollout.max_tokens", "12", "--rollout.max_total_tokens", "48", "--data.eval_path",
         "builtin:tool_problems?split=eval&n=6", "--data.eval_size", "6", "--eval.samples_per_prompt", "2",
         "--eval.pass_k", "[1, 2]", "--output_dir", str(tmp_path / "run"), "--logging.wandb_mode", "offline",
         "--out", str(out)],
        cwd=tmp_path, capture_output=True, text=True, timeout=900, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    report = dict(json.loads(out.read_text()), report_path=str(out))
    print(r.stdout)
    base = report["base"]
    assert base["num_prompts"] == 6 and base["accuracy_from"] == ["env_reward"]
    assert base["note"].startswith("evaluation: accuracy and pass@k from the environment's reward")
    for k in ("sampled_accuracy", "greedy_accuracy", "pass@2", "turns_mean", "tool_calls_mean", "tool_use_frac"):
        assert k in base, k
    assert 1.0 <= base["turns_mean"] <= 4.0 and sum(base["stop_reasons"].values()) == 12
    s = base["samples"][0]
    assert len(s["conversations"]) == 2 and s["conversations"][0][0]["role"] == "assistant"
    lines = r.stdout.splitlines()
    assert any(ln.startswith("turns/traj ") for ln in lines) and any(ln.startswith("tool_calls/traj ") for ln in lines)
    table = [ln for ln in eval_table(report) if not ln.startswith(("report:", "wandb:"))]  # the printed tables
    assert [ln for ln in lines if ln and ln in table] == [ln for ln in table if ln]
    # the config's eval.extra: the calculator's problems phrased another way, evaluated the same way
    ood = base["extra"]["ood"]
    assert ood["source"].startswith("builtin:tool_problems_ood") and ood["num_prompts"] == 6
    assert ood["accuracy_from"] == ["env_reward"] and "tool_calls_mean" in ood and "greedy_accuracy" in ood
    assert "ood: builtin:tool_problems_ood?n=128" in lines
