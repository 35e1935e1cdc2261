"""``grpo-dist train`` for 2 steps on a real pretrained chat model (slow): ``model.path:
pkg:smollm2-135m-instruct`` resolved on the driver to the converted directory (cached in the
user-level cache, ``~/.cache/grpo_dist``, by the ``smollm2_dir`` fixture), and vLLM's behaviour log-probs against the learner's, as
the run logs them (``train/logprob_diff_behaviour_max``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[1]
LOGPROB_TOL = 2e-2  # as tests/test_real_model.py


def test_train_two_steps_on_the_packaged_model_through_the_cli(smollm2_dir, tmp_path):
    from grpo_dist.models.gguf_source import cache_root

    out = tmp_path / "run"
    env = dict(os.environ, GRPO_DIST_CACHE=str(cache_root()), HF_HUB_OFFLINE="1", PYTHONPATH=str(ROOT))
    cmd = [sys.executable, "-m", "grpo_dist.cli", "train", "--config", str(ROOT / "configs" / "smollm2_cpu.yaml"),
           "--trainer.steps", "2", "--rollout.prompts_per_step", "2", "--rollout.group_size", "4",
           "--rollout.max_tokens", "24", "--model.dtype", "float32",  # fp32: the agreement check below
           "--data.eval_path", "null", "--eval.extra", "{}", "--trainer.eval_before_after", "false",
           "--checkpoint.every", "0", "--logging.wandb_mode", "disabled", "--logging.progress", "false",
           "--output_dir", str(out)]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"model.path pkg:smollm2-135m-instruct -> {smollm2_dir}" in proc.stdout
    summary = json.loads((out / "summary.json").read_text())
    m = summary["final_metrics"]
    assert summary["steps"] == 2 and (out / "adapter" / "adapter_config.json").is_file()
    print(f"2 steps: logprob_diff_behaviour max {m['train/logprob_diff_behaviour_max']:.2e} "
          f"mean {m['train/logprob_diff_behaviour_mean']:.2e}; timing {summary['mean_timing']}")
    assert m["train/logprob_diff_behaviour_max"] < LOGPROB_TOL  # vLLM's samples vs the learner, in the run
    # the recipe's math reward: each step logs the shares of the answers' forms (where hacks show)
    forms = {k: v for k, v in m.items() if k.startswith("rollout/answer_form/")}
    assert len(forms) == 7 and sum(forms.values()) == pytest.approx(1.0), forms
    assert (out / "config.yaml").read_text().count(str(smollm2_dir)) == 1  # the converted dir, everywhere
