"""A reward function failing on more than reward.max_failure_rate of its completions over
reward.failure_window steps stops the run with a checkpoint and its first traceback."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from grpo_dist.config import load_config
from grpo_dist.reward.failures import FailureWatch, RewardFailureError
from grpo_dist.reward.worker import RewardWorker

ROOT = Path(__file__).resolve().parents[1]


def _watch(rate=0.5, window=3):
    return FailureWatch(load_config(None, {"reward": {"max_failure_rate": rate, "failure_window": window}}).reward)


def test_rate_is_measured_over_the_window_of_steps():
    w = _watch(rate=0.5, window=3)
    w.observe(8, {"ok": 0, "flaky": 8}, {"flaky": "Traceback ... KeyError: 'x'"})
    assert w.end_step() == {"reward/failure_rate/ok": 0.0, "reward/failure_rate/flaky": 1.0}  # window not full yet
    w.observe(4, {"ok": 0, "flaky": 0})
    w.observe(4, {"ok": 0, "flaky": 1}, {"flaky": "a later traceback"})  # two scoring rounds in one step
    assert w.end_step()["reward/failure_rate/flaky"] == pytest.approx(9 / 16)
    w.observe(8, {"ok": 1, "flaky": 0})
    rates = w.end_step()  # full window: 9 of 24 under the limit
    assert rates == {"reward/failure_rate/ok": pytest.approx(1 / 24), "reward/failure_rate/flaky": pytest.approx(9 / 24)}
    w.observe(8, {"flaky": 3})  # the first step leaves the window: (1 + 0 + 3) / 24
    assert w.end_step()["reward/failure_rate/flaky"] == pytest.approx(4 / 24)
    assert w.first_traceback == {"flaky": "Traceback ... KeyError: 'x'"}


def test_stops_only_past_the_limit_once_the_window_is_full():
    w = _watch(rate=0.5, window=2)
    for errors in ({"f": 3}, {"f": 4}):  # 7 of 16 = 0.4375: under the limit
        w.observe(8, errors, {"f": "Traceback (most recent call last):\nZeroDivisionError: division by zero"})
        w.end_step()
    w.observe(8, {"f": 8})  # window = the last 2 steps: 12 of 16 = 0.75
    with pytest.raises(RewardFailureError) as e:
        w.end_step()
    err = e.value
    assert (err.fn, err.scored, err.window) == ("f", 16, 2) and err.rate == pytest.approx(0.75)
    assert "reward function 'f' failed on 75% of its 16 completions over the last 2 steps" in str(err)
    assert err.details().endswith("ZeroDivisionError: division by zero")  # the first traceback, not a later one
    never = _watch(rate=1.0, window=1)
    never.observe(8, {"f": 8})
    assert never.end_step() == {"reward/failure_rate/f": 1.0}


def test_worker_sends_each_functions_first_traceback_once(tmp_path):
    plugin = tmp_path / "bad.py"
    plugin.write_text("def boom(prompts, completions, **kw):\n    return [1 / 0 for _ in completions]\n")
    w = RewardWorker(load_config(None, {"reward": {"functions": [{"fn": f"{plugin}:boom"}, {"fn": "format"}]}}).reward)
    first = w.score(["p"] * 2, ["a", "b"])
    assert first.errors == {"boom": 2, "format": 0} and list(first.tracebacks) == ["boom"]
    assert "ZeroDivisionError: division by zero" in first.tracebacks["boom"] and "bad.py" in first.tracebacks["boom"]
    second = w.score(["p"] * 2, ["a", "b"])
    assert second.errors["boom"] == 2 and second.tracebacks == {}


@pytest.mark.slow
def test_a_reward_that_always_raises_stops_the_run_with_a_checkpoint(pretrained_model_dir, tmp_path):
    """End to end through the CLI: local Ray, transformers rollouts, DeepSpeed learner."""
    plugin = tmp_path / "rewards.py"
    plugin.write_text("def boom(prompts, completions, **kw):\n    raise RuntimeError('reward server down')\n")
    out = tmp_path / "run"
    t0 = time.perf_counter()
    r = subprocess.run(
        [sys.executable, "-m", "grpo_dist.cli", "train", "--config", "configs/tiny_cpu.yaml",
         "--model.path", str(pretrained_model_dir), "--model.make_if_missing", "null", "--output_dir", str(out),
         "--rollout.backend", "hf", "--rollout.num_workers", "1", "--rollout.prompts_per_step", "2",
         "--rollout.group_size", "4", "--trainer.steps", "20", "--trainer.eval_before_after", "false",
         "--reward.functions", f"[{{fn: correctness}}, {{fn: '{plugin}:boom', weight: 0.1}}]",
         "--reward.failure_window", "2", "--checkpoint.every", "0", "--logging.wandb_mode", "disabled",
         "--logging.progress", "false"],
        cwd=ROOT, capture_output=True, text=True, timeout=600)
    seconds = time.perf_counter() - t0
    assert r.returncode == 1, r.stderr[-3000:]
    err = r.stderr[r.stderr.index("error: step 2:"):]
    assert "reward function 'boom' failed on 100% of its 16 completions over the last 2 steps" in err
    assert "reward.max_failure_rate 0.5" in err and "stopped with a checkpoint of step 1" in err
    assert "first failure of 'boom':\nTraceback (most recent call last):" in err
    assert "RuntimeError: reward server down" in err and "rewards.py" in err
    ckpt = out / "checkpoints" / "step_000001"
    assert (ckpt / "trainer_state.json").is_file() and str(ckpt) in err
    assert not (out / "checkpoints" / "step_000002").exists() and not (out / "summary.json").exists()
    print(f"stopped after {seconds:.0f} s")
