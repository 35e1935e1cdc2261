"""benchmarks/answer_forms.py: the form of each completion's final answer, per logged step."""

from __future__ import annotations

import json
import os

import pytest
from scripts import load_script

from grpo_dist.reward.answer_form import FORMS, answer_form, form_metrics

SCRIPT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks", "answer_forms.py")


@pytest.mark.parametrize("text,expected", [
    ("so \\boxed{29}", "box:number"), ("\\boxed{29 cards}", "box:number"), ("\\boxed{14 + 15}", "box:expr"),
    ("\\boxed{3 \\times 4}", "box:expr"), ("\\boxed{} is the answer \\boxed{}", "box:empty"),
    ("\\boxed{x}", "box:other"), ("Emma has 12 + 7 = 19 stickers.", "plain:result"),
    ("Emma has 12 + 7 stickers.", "plain:expr"), ("I do not know.", "plain:other"), ("", "plain:other"),
])
def test_forms(text, expected):
    assert answer_form(text) == expected


def test_form_metrics_only_with_a_math_reward():
    """A run with the math reward (directly or inside a composite) logs each form's share per step;
    a run without one logs none."""
    from grpo_dist.config import config_from_dict

    texts = ["\\boxed{29}", "\\boxed{14 + 15}", "\\boxed{}", "Emma has 12 + 7 stickers."]
    m = form_metrics([{"fn": "math"}], texts)
    assert m == {"rollout/answer_form/box:number": 0.25, "rollout/answer_form/box:expr": 0.25,
                 "rollout/answer_form/box:empty": 0.25, "rollout/answer_form/box:other": 0.0,
                 "rollout/answer_form/plain:result": 0.0, "rollout/answer_form/plain:expr": 0.25,
                 "rollout/answer_form/plain:other": 0.0}
    nested = {"fn": "composite", "kwargs": {"components": [{"fn": "composite", "kwargs": {"components": [
        {"fn": "math"}, {"fn": "length"}]}}]}}
    assert form_metrics([{"fn": "correctness"}, nested], texts) == m
    assert form_metrics([{"fn": "correctness"}, {"fn": "composite", "kwargs": {"components": [{"fn": "format"}]}}],
                        texts) == {}
    recipe = config_from_dict({"reward": {"functions": [{"fn": "math", "kwargs": {"form": "number"}},
                                                        {"fn": "pattern", "weight": 0.1, "kwargs": {"regex": "x"}}]}})
    assert form_metrics(recipe.reward.functions, []) == {f"rollout/answer_form/{f}": 0.0 for f in FORMS}
    assert form_metrics(config_from_dict({}).reward.functions, texts) == {}


def test_a_run_dir_gives_one_row_per_sample_table(tmp_path):
    mod = load_script(SCRIPT)
    d = tmp_path / "run" / "wandb" / "offline-run-1" / "files" / "media" / "table"
    d.mkdir(parents=True)
    cols = ["prompt", "completion", "answer", "reward", "finish_reason", "adapter_version"]
    for step, comps in ((10, [("\\boxed{}\\boxed{}", 0.1, "length"), ("\\boxed{}", 0.1, "stop")]),
                        (20, [("\\boxed{4 + 5}", 1.1, "stop"), ("4 + 5 = 9", 1.0, "stop")])):
        (d / f"samples_{step}_abc.table.json").write_text(json.dumps(
            {"columns": cols, "data": [["q", c, "9", r, f, step] for c, r, f in comps]}))
    os.symlink(tmp_path / "run" / "wandb" / "offline-run-1", tmp_path / "run" / "wandb" / "latest-run")
    rows = mod.rows(str(tmp_path / "run"))
    assert [(r["step"], r["n"]) for r in rows] == [(10, 2), (20, 2)]  # the latest-run link is not read twice
    assert rows[0]["box:empty"] == 1.0 and rows[0]["truncated"] == 0.5 and rows[0]["reward"] == pytest.approx(0.1)
    assert rows[1]["box:expr"] == 0.5 and rows[1]["plain:result"] == 0.5
    assert "| 20 | 2 | 0.00 | 0.50 |" in mod.table(rows)
