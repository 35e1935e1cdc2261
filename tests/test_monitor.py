"""Monitors: step timer, non-finite detection, console lines, W&B offline files."""

from __future__ import annotations

import math
import time
from pathlib import Path

from grpo_dist.run.monitor import ConsoleMonitor, StepTimer, WandbMonitor, format_metrics, non_finite


def test_step_timer_accumulates_phases():
    t = StepTimer()
    with t("generate"):
        time.sleep(0.01)
    with t("generate"):
        time.sleep(0.01)
    m = t.metrics()
    assert m["timing/generate"] >= 0.02 and m["timing/step"] >= m["timing/generate"]


def test_step_timer_names_the_time_outside_every_phase():
    """``timing/other``: the step's seconds that no phase timed, so the phases and it add up to
    the step (what a profile of a slow step starts from)."""
    t = StepTimer()
    with t("generate"):
        time.sleep(0.02)
    time.sleep(0.05)  # untimed work between phases
    with t("learn"):
        time.sleep(0.01)
    m = t.metrics()
    assert m["timing/other"] >= 0.05
    assert abs(m["timing/generate"] + m["timing/learn"] + m["timing/other"] - m["timing/step"]) < 1e-9


def test_non_finite_names_bad_metrics():
    assert non_finite({"a": 1.0, "b": math.nan, "c": math.inf, "d": 3}) == ["b", "c"]


def test_console_prints_a_line_per_step_without_a_terminal(capsys):
    mon = ConsoleMonitor(enabled=True)
    mon.start(3)
    mon.log({"rollout/reward_mean": 0.5, "train/kl": 0.01, "train/loss": -0.2, "timing/step": 1.5}, 1)
    mon.log({"sync/bytes": 10.0}, 1)  # no train/eval metrics: nothing printed
    mon.log({"rollout/reward_mean": 0.25, "reward/math": 0.5, "reward/format": 0.0, "train/loss": 0.1,
             "timing/step": 1.5}, 3)
    out = capsys.readouterr().out.strip().splitlines()
    assert out[0].startswith("step 1/3  reward 0.500  kl 0.0100  loss -0.2000  s/step 1.5  eta 0:0")
    # several reward functions: each one's mean; the last step has no ETA
    assert out[1] == "step 3/3  reward 0.250  (format 0.000 math 0.500)  loss +0.1000  s/step 1.5"
    assert format_metrics({}) == ""


def test_wandb_offline_writes_a_run(tmp_path):
    wb = WandbMonitor(mode="offline", project="grpo_dist-test", entity=None, name="t", directory=tmp_path,
                      config={"x": 1})
    wb.log({"train/loss": 0.5, "rollout/reward_mean": 0.25}, step=1)
    wb.log_table("samples", ["prompt", "completion"], [["1+1=", "2"]], step=1)
    wb.summary({"steps": 1, "nested": {"skip": True}})
    run_dir = Path(wb.run_dir)
    wb.close()
    assert run_dir.is_dir() and list(run_dir.glob("*.wandb"))


def test_wandb_from_config_is_the_one_setup_of_train_and_eval(tmp_path):
    from grpo_dist.config import load_config
    from grpo_dist.run.prepare import make_monitor

    cfg = load_config(None, ["--output_dir", str(tmp_path), "--logging.wandb_mode", "offline",
                             "--logging.project", "grpo_dist-test"])
    wb = WandbMonitor.from_config(cfg, default_name="eval", config={"eval": "adapter-dir"})  # what eval does
    assert wb.run.name == "eval" and dict(wb.run.config) == {"eval": "adapter-dir"}
    assert Path(wb.run_dir).resolve().is_relative_to(tmp_path.resolve())
    wb.close()

    multi = make_monitor(cfg)  # what training does: the whole config recorded
    train_wb = next(m for m in multi.monitors if isinstance(m, WandbMonitor))
    assert train_wb.run.config["rollout"]["group_size"] == cfg.rollout.group_size
    assert multi.wandb_dir == train_wb.run_dir
    multi.close()


def test_sync_clocks_take_the_slowest_worker_of_each_phase():
    from grpo_dist.sync.weight_sync import sync_clocks

    answers = [{"seconds": 0.3, "merge_s": 0.1, "write_s": 0.05, "load_s": 0.1},
               {"seconds": 0.2, "merge_s": 0.02, "write_s": 0.08, "load_s": 0.09}]
    assert sync_clocks(answers) == {"timing/sync_merge": 0.1, "timing/sync_write": 0.08, "timing/sync_load": 0.1}
    assert sync_clocks([{"seconds": 0.0, "skipped": 1.0}]) == {} and sync_clocks([]) == {}
