"""Where a run's outputs go: one absolute output_dir on the driver's node, a run id kept across
resume, and a relative output_dir inside a Ray job never resolved in Ray's runtime copy."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from grpo_dist.config import ConfigError, load_config
from grpo_dist.run.outputs import resolve_outputs, resume_command
from grpo_dist.util.paths import SUBMIT_DIR_ENV

JOB_ENV = "RAY_JOB_CONFIG_JSON_ENV_VAR"  # set by Ray in a submitted job's driver


def test_relative_output_dir_resolves_against_the_cwd(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(JOB_ENV, raising=False)
    cfg = resolve_outputs(load_config(None, {"output_dir": "runs/a", "checkpoint": {"dir": "ck"}}))
    assert cfg.output_dir == str(tmp_path / "runs" / "a") and cfg.checkpoint.dir == str(tmp_path / "ck")
    run = json.loads((tmp_path / "runs" / "a" / "run.json").read_text())
    assert run["run_id"] == cfg.trainer.run_id and len(cfg.trainer.run_id) == 12
    # the code that ran: this checkout's commit (the tests run from one; CI from a clean clone)
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=os.path.dirname(os.path.abspath(__file__)),
                          capture_output=True, text=True)
    assert run["code"]["grpo_dist"] and run["code"].get("commit") == (head.stdout.strip() or None)
    assert isinstance(run["code"].get("dirty", False), bool)
    saved = load_config(tmp_path / "runs" / "a" / "config.yaml")
    assert saved.trainer.run_id == cfg.trainer.run_id and saved.output_dir == cfg.output_dir
    assert resume_command(cfg) == f"grpo-dist train --config {tmp_path / 'runs/a/config.yaml'} --checkpoint.resume auto"


def test_a_resumed_run_keeps_its_run_id_and_a_new_run_gets_a_new_one(tmp_path):
    first = resolve_outputs(load_config(None, {"output_dir": str(tmp_path)}))
    resumed = resolve_outputs(load_config(None, {"output_dir": str(tmp_path), "checkpoint": {"resume": "auto"}}))
    fresh = resolve_outputs(load_config(None, {"output_dir": str(tmp_path)}))
    assert resumed.trainer.run_id == first.trainer.run_id != fresh.trainer.run_id


def test_relative_output_dir_in_a_ray_job_needs_the_submitters_dir(tmp_path, monkeypatch):
    monkeypatch.setenv(JOB_ENV, "{}")
    monkeypatch.delenv(SUBMIT_DIR_ENV, raising=False)
    with pytest.raises(ConfigError) as e:
        resolve_outputs(load_config(None, {"output_dir": "runs/job"}))
    assert str(e.value).startswith("output_dir: the relative path 'runs/job' would land in Ray's temporary copy")
    monkeypatch.setenv(SUBMIT_DIR_ENV, str(tmp_path))
    assert resolve_outputs(load_config(None, {"output_dir": "runs/job"})).output_dir == str(tmp_path / "runs/job")
    absolute = tmp_path / "abs"
    monkeypatch.delenv(SUBMIT_DIR_ENV)
    assert resolve_outputs(load_config(None, {"output_dir": str(absolute)})).output_dir == str(absolute)


def test_cli_in_a_ray_job_refuses_a_relative_output_dir_with_one_line(tiny_model_dir, tmp_path):
    env = {k: v for k, v in __import__("os").environ.items() if k != SUBMIT_DIR_ENV}
    env[JOB_ENV] = "{}"
    p = subprocess.run([sys.executable, "-m", "grpo_dist.cli", "train", "--model.path", str(tiny_model_dir),
                        "--model.make_if_missing", "null", "--output_dir", "runs/x", "--logging.wandb_mode", "disabled"],
                       capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120,
                       )
    assert p.returncode == 2, p.stderr[-2000:]
    assert p.stderr.strip().splitlines()[-1].startswith(
        "config error: output_dir: the relative path 'runs/x' would land in Ray's temporary copy")
    assert not (tmp_path / "runs").exists()


def _checkpoint(cfg, step=2, holds=None, adapter=None):
    """A checkpoint directory as checkpoint.save leaves it, as far as the resume check reads it."""
    from grpo_dist.run.checkpoint import STATE_FILE, holds as holds_of, step_dir

    d = step_dir(cfg, step)
    d.mkdir(parents=True)
    state = {"step": step}
    if holds is not False:
        state["holds"] = holds or holds_of(cfg)
    (d / STATE_FILE).write_text(json.dumps(state))
    if adapter is not None:
        (d / "adapter").mkdir()
        (d / "adapter" / "adapter_config.json").write_text(json.dumps(adapter))
    return d


def test_resume_auto_without_a_checkpoint_says_it_starts_fresh(tmp_path, capsys):
    resolve_outputs(load_config(None, {"output_dir": str(tmp_path), "checkpoint": {"resume": "auto"}}))
    assert f"no checkpoint in {tmp_path / 'checkpoints'}, starting fresh" in capsys.readouterr().out


def test_a_resume_that_changes_what_the_checkpoint_holds_is_refused_and_writes_nothing(tmp_path, tiny_model_dir):
    base = {"output_dir": str(tmp_path), "model": {"path": str(tiny_model_dir)}}
    first = resolve_outputs(load_config(None, base))
    saved = (tmp_path / "config.yaml").read_text()
    ckpt = _checkpoint(first)
    ok = resolve_outputs(load_config(None, {**base, "checkpoint": {"resume": "auto"}}), write=False)
    assert ok.trainer.run_id == first.trainer.run_id
    cases = [({"lora": {"r": 4}}, "lora.r (8, now 4)"),
             ({"lora": {"target_modules": ["v_proj", "q_proj"]}},
              "lora.target_modules ([q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj], now [v_proj, q_proj])"),
             ({"lora": {"enabled": False}}, "lora.enabled (true, now false)"),
             ({"model": {"dtype": "bfloat16"}, "lora": {"dtype": "model"}},  # DeepSpeed's bf16 optimizer state
              "model.dtype / lora.dtype (float32, now bfloat16)"),
             ({"model": {"path": str(tmp_path)}}, f"model.path ({tiny_model_dir}, now {tmp_path})")]
    for change, words in cases:
        over = {**base, **change, "model": {**base["model"], **change.get("model", {})},
                "checkpoint": {"resume": "auto"}}
        with pytest.raises(ConfigError) as e:
            resolve_outputs(load_config(None, over))
        assert str(e.value) == (f"checkpoint.resume: {ckpt} was trained with other {words}; resume with the "
                                f"checkpoint's values or start a new output_dir")
        assert (tmp_path / "config.yaml").read_text() == saved  # the resume command's file is untouched
    reordered = {**base, "lora": {"target_modules": list(reversed(first.lora.target_modules))},
                 "checkpoint": {"resume": str(ckpt)}}
    resolve_outputs(load_config(None, reordered), write=False)  # the same targets in another order


def test_an_older_checkpoint_is_checked_against_its_adapter_and_a_bad_path_is_one_line(tmp_path):
    cfg = resolve_outputs(load_config(None, {"output_dir": str(tmp_path)}))
    _checkpoint(cfg, holds=False, adapter={"r": 8, "lora_alpha": 16.0, "target_modules": ["q_proj", "v_proj"]})
    with pytest.raises(ConfigError, match=r"lora\.target_modules \(\[q_proj, v_proj\], now \[q_proj, k_proj"):
        resolve_outputs(load_config(None, {"output_dir": str(tmp_path), "checkpoint": {"resume": "auto"}}))
    with pytest.raises(ConfigError, match=r"^checkpoint\.resume: .*nope is not a complete checkpoint"):
        resolve_outputs(load_config(None, {"output_dir": str(tmp_path), "checkpoint": {"resume": str(tmp_path / "nope")}}))


def test_summary_lines_say_before_after_memory_and_failures():
    from grpo_dist.run.outputs import summary_lines

    s = {"sampled_accuracy_before": 0.077, "sampled_accuracy_after": 0.965, "steps": 24, "wall_seconds": 1337.4,
         "peak_rss_gib": {"learner": 4.73, "rollout": 6.48}, "adapter_dir": "/r/adapter",
         "hosts": {"driver": ["10.0.0.1"], "learner": ["10.0.0.1", "10.0.0.2"], "rollout": ["10.0.0.3"]},
         "reward_failures": {"math": {"failed": 2, "scored": 1536, "rate": 2 / 1536, "first_failure": "timeout"},
                             "pattern": {"failed": 0, "scored": 1536, "rate": 0.0}}}
    lines = summary_lines(s)
    assert lines[0] == "\n=== grpo-dist summary ==="
    assert "sampled_accuracy   before 0.077  after 0.965  (+0.888)" in lines
    assert "steps 24  wall 1337 s" in lines
    assert lines[lines.index("steps 24  wall 1337 s") + 1].startswith("peak RSS  learner 4.7 GiB, rollout 6.5 GiB")
    assert "hosts     driver 10.0.0.1, learner 10.0.0.1 10.0.0.2, rollout 10.0.0.3" in lines
    assert [ln for ln in lines if ln.startswith("reward function")] == [
        "reward function 'math' failed on 2 of 1536 completions (0.1%): timeout"]


def test_summary_lines_of_a_run_evaluated_only_after_training():
    """eval.before: false: the after figures alone, main set and eval.extra's."""
    from grpo_dist.run.outputs import summary_lines

    s = {"sampled_accuracy_after": 0.9, "greedy_accuracy_after": 0.95, "steps": 2, "wall_seconds": 10.0,
         "adapter_dir": "/r/adapter",
         "eval_sets": {"ood": {"source": "builtin:word_problems_ood", "sampled_accuracy_after": 0.25}}}
    lines = summary_lines(s)
    assert lines[1:4] == ["sampled_accuracy   after 0.900", "greedy_accuracy    after 0.950",
                          "ood/sampled_accuracy after 0.250"]


def test_max_minutes_stops_before_a_step_that_would_end_past_the_budget(monkeypatch, capsys):
    """trainer.max_minutes 1 with 20 s steps: steps 1-3 run (the 3rd ends at 60 s), no 4th; then
    a step of 10 s more would, at the mean, end past it. The summary line says why it stopped."""
    import grpo_dist.run.run as run_mod
    from grpo_dist.run.outputs import summary_lines

    clock = [100.0]
    monkeypatch.setattr(run_mod.time, "perf_counter", lambda: clock[0])
    run = run_mod.Run(load_config(None, {"trainer": {"max_minutes": 1, "steps": 100}}))
    assert not run.out_of_time()  # the first step always starts
    for step, t in ((1, 120.0), (2, 140.0)):
        run.step, clock[0] = step, t
        assert not run.out_of_time(), step  # 20 s done per step: the next ends by 60 s
    run.step, clock[0] = 3, 150.0  # 50 s for 3 steps: the 4th would end at ~66.7 s
    assert run.out_of_time() and run.stopped == "max_minutes"
    assert "stopping after step 3 of 100 (0.8 min of steps, 17 s each)" in capsys.readouterr().out
    assert not run_mod.Run(load_config(None, {})).out_of_time()  # no budget
    assert "steps 3  wall 61 s  (trainer.max_minutes reached)" in summary_lines(
        {"steps": 3, "wall_seconds": 61.0, "adapter_dir": "/r/adapter", "stopped": "max_minutes"})


def test_the_console_eta_is_capped_by_max_minutes(monkeypatch, capsys):
    import grpo_dist.run.monitor.console as con

    clock = [1000.0]
    monkeypatch.setattr(con.time, "perf_counter", lambda: clock[0])
    for budget, want in ((None, "eta 9:00"), (5, "eta 4:00 (trainer.max_minutes)"), (60, "eta 9:00")):
        m = con.ConsoleMonitor(enabled=True, max_minutes=budget)
        m.live = False
        m.start(10)
        clock[0] += 60.0
        m.log({"train/loss": 0.0, "timing/step": 60.0}, 1)  # one 60 s step of 10: 9 left
        assert capsys.readouterr().out.rstrip().endswith(want), budget


def test_full_weights_on_a_shared_dir_check_output_dir_where_the_run_resolves_it(tmp_path, monkeypatch):
    """In a Ray job the cwd is Ray's copy of the working dir: a relative output_dir is checked
    against the submitter's directory, as the run resolves it, not against that copy."""
    shared = tmp_path / "shared"
    job_cwd = tmp_path / "runtime_resources" / "working_dir"
    job_cwd.mkdir(parents=True)
    shared.mkdir()
    over = {"lora": {"enabled": False}, "cluster": {"shared_dir": str(shared)}, "output_dir": "runs/x"}
    monkeypatch.chdir(job_cwd)
    monkeypatch.setenv(JOB_ENV, "{}")
    monkeypatch.setenv(SUBMIT_DIR_ENV, str(shared / "me"))
    cfg = load_config(None, over)  # inside shared/ once resolved: accepted
    assert resolve_outputs(cfg, write=False).output_dir == str(shared / "me" / "runs" / "x")
    monkeypatch.setenv(SUBMIT_DIR_ENV, str(tmp_path / "home"))
    with pytest.raises(ConfigError, match=r"^output_dir: full-weight training with cluster.shared_dir"):
        load_config(None, over)
    monkeypatch.delenv(JOB_ENV)
    monkeypatch.chdir(shared)  # outside a job: against the cwd; `..` normalised
    load_config(None, over)
    with pytest.raises(ConfigError, match=r"^output_dir: full-weight"):
        load_config(None, dict(over, output_dir="../elsewhere"))


def test_startup_times_name_the_slowest_engine_and_learner_and_the_rest():
    """The start-up line and ``startup/*``: the set-ups overlap, so the rest is the total past the slower."""
    from grpo_dist.run.workers import startup_times

    info = {"rollout": [{"startup_s": 80.0}, {"startup_s": 95.0}],
            "learner": [{"timing/setup": 40.0, "timing/init_distributed": 2.0}, {"timing/setup": 42.0,
                                                                                  "timing/init_distributed": 3.0}],
            "reward": [["correctness"]]}
    times, line = startup_times(info, 120.0)
    assert times == {"startup/actors_s": 120.0, "startup/engine_s": 95.0, "startup/learner_s": 42.0,
                     "startup/learner_process_group_s": 3.0, "startup/other_s": 25.0}
    assert line.startswith("actors ready in 120 s: engine start 95 s (slowest of 2), learner set-up 42 s")
    assert startup_times({}, 5.0)[0]["startup/other_s"] == 5.0  # no set-up info: all of it is the rest
