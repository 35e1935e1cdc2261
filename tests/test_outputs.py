"""Where a run's outputs go: one absolute output_dir on the driver's node, a run id kept across
resume, and a relative output_dir inside a Ray job never resolved in Ray's runtime copy."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from grpo_dist.config import ConfigError, load_config
from grpo_dist.run.outputs import SUBMIT_DIR_ENV, resolve_outputs, resume_command

JOB_ENV = "RAY_JOB_CONFIG_JSON_ENV_VAR"  # set by Ray in a submitted job's driver


def test_relative_output_dir_resolves_against_the_cwd(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(JOB_ENV, raising=False)
    cfg = resolve_outputs(load_config(None, {"output_dir": "runs/a", "checkpoint": {"dir": "ck"}}))
    assert cfg.output_dir == str(tmp_path / "runs" / "a") and cfg.checkpoint.dir == str(tmp_path / "ck")
    run = json.loads((tmp_path / "runs" / "a" / "run.json").read_text())
    assert run["run_id"] == cfg.trainer.run_id and len(cfg.trainer.run_id) == 12
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
