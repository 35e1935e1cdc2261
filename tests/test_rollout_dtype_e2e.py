"""rollout.dtype end to end: vLLM (CPU build) engines serving bfloat16 weights while the learner
trains in float32, merged-weight serving, truncated importance sampling correcting the rounding."""

from __future__ import annotations

import math
from pathlib import Path

import e2e
import pytest

from grpo_dist.config import load_config
from grpo_dist.train import train

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[1]


def test_bfloat16_engine_float32_learner(pretrained_model_dir, tmp_path):
    """The engine's log-probs differ from the learner's by bfloat16 rounding (float32 engines agree
    to ~2e-6, tests/test_e2e.py) at every step, each merged version reloaded into bfloat16 weights;
    the IS weights stay within the threshold and the updates are finite."""
    from grpo_dist.cluster.ray_utils import shutdown_ray
    threshold = 2.0
    cfg = load_config(ROOT / "configs/tiny_cpu.yaml", {
        "output_dir": str(tmp_path), "model": {"path": str(pretrained_model_dir), "make_if_missing": None},
        "rollout": {"num_workers": 1, "dtype": "bfloat16", "prompts_per_step": 8, "group_size": 4},
        "learner": {"micro_batch_size": 32},
        "algo": {"rollout_is": "truncate", "rollout_is_level": "token", "rollout_is_threshold": threshold},
        "trainer": {"steps": 3, "eval_before_after": False, "max_staleness": 0},
        "checkpoint": {"every": 0}, "logging": {"wandb_mode": "disabled", "progress": False},
    })
    assert cfg.model.dtype == "float32" and cfg.rollout.dtype == "bfloat16"
    h = []
    trainer = e2e.start(cfg)
    try:
        train(trainer)
        h = trainer.history
        assert [x["train/version"] for x in h] == [1.0, 2.0, 3.0]
        for x in h:
            diff = x["train/logprob_diff_behaviour_mean"]
            assert 1e-4 < diff < 0.05, diff
            assert x["train/logprob_diff_behaviour_max"] < 1.0
            assert 0 < x["train/is_weight_mean"] <= x["train/is_weight_max"] <= threshold + 1e-9
            assert math.isfinite(x["train/loss"]) and math.isfinite(x["train/grad_norm"])
    finally:
        print([{k.removeprefix("train/"): round(x[k], 6) for k in ("train/logprob_diff_behaviour_mean",
               "train/logprob_diff_behaviour_max", "train/is_weight_mean", "train/is_clipped_frac")} for x in h])
        trainer.close()
        shutdown_ray()  # the local cluster the run started
