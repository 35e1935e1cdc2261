"""The W&B conversation table of multi-turn runs (``run.monitor.tables.sample_table``): trajectories of a
scripted tool environment (the demo's tiny model, transformers backend, in process), logged to an
offline W&B run and read back from its ``.wandb`` file: each turn's role and text, the tool
results, reward, stop reason, turns and tool counters."""

from __future__ import annotations

from pathlib import Path

from wandb_tables import logged_tables

from grpo_dist.run.monitor.tables import CONVERSATION_COLUMNS, SAMPLE_COLUMNS, sample_table
from grpo_dist.config import load_config
from grpo_dist.data import make_task
from grpo_dist.rollout.worker import RolloutWorker
from grpo_dist.run.monitor import WandbMonitor
from grpo_dist.types import RewardResult

SCRIPT = f"{Path(__file__).parent / 'env_helpers.py'}:ToolScript"


def _worker(model_dir, **rollout):
    cfg = load_config(None, {"model": {"path": str(model_dir)}, "lora": {"enabled": False},
                             "rollout": {"backend": "hf", "group_size": 2, "max_tokens": 6, **rollout}})
    w = RolloutWorker(cfg)
    w.setup()
    return w


def test_the_conversation_table_in_an_offline_wandb_run(pretrained_model_dir, tmp_path):
    w = _worker(pretrained_model_dir, env=SCRIPT)
    try:
        groups = w.generate(make_task("add", 4, seed=7, split="eval"), keys=[(0, 1, i) for i in range(4)])
    finally:
        w.close()
    flat = [r for g in groups for r in g.rollouts]
    scores = RewardResult(total=[float(i) for i in range(len(flat))], per_function={})
    name, cols, rows = sample_table(groups, scores, limit=3)
    assert name == "conversations" and cols == CONVERSATION_COLUMNS and len(rows) == 3

    wb = WandbMonitor(mode="offline", project="t", entity=None, name="t", directory=tmp_path, config={})
    wb.log_table(name, cols, rows, step=1)
    run_dir = wb.run_dir
    wb.close()
    got_cols, got_rows = logged_tables(run_dir)["conversations"]
    assert got_cols == CONVERSATION_COLUMNS and got_rows == rows
    for k, row in enumerate(got_rows):
        r, d = groups[k].rollouts[0], dict(zip(got_cols, row))
        assert d["reward"] == float(2 * k) and d["stop_reason"] == r.stop_reason and d["turns"] == r.turns
        roles = d["roles"].split()
        assert roles[0] == "assistant" and roles.count("assistant") == r.turns
        assert roles.count("tool") == r.turns - 1  # each tool result the model read (not one after a cut turn)
        lines = d["conversation"].split("\n")
        if r.stop_reason == "done":  # ToolScript: a result, then a failed call's error, then the end
            assert roles == ["assistant", "tool", "assistant", "tool", "assistant"]
            assert d["tool_calls"] == 2 and d["tool_errors"] == 1
            assert "[tool] 4" in lines and "[tool] Error: bad" in lines
        assert [ln.split("]")[0][1:] for ln in lines if ln.startswith("[")] == roles

    for r in flat:
        r.loss_mask, r.messages = None, None
    name, cols, _ = sample_table(groups, scores, limit=3)  # one-turn runs keep the samples table
    assert name == "samples" and cols == SAMPLE_COLUMNS
