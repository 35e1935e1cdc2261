"""A relative model.path or data path resolves like output_dir: against the current directory, or
in a Ray job's driver against the submitter's directory (never Ray's copy of the working dir).
Fast: config only (the job path through launch/submit_job.sh is in test_ray_job.py)."""

from __future__ import annotations

from pathlib import Path

from grpo_dist.config import load_config
from grpo_dist.run.inputs import resolve_inputs
from grpo_dist.util.paths import SUBMIT_DIR_ENV

JOB_ENV = "RAY_JOB_CONFIG_JSON_ENV_VAR"


def _cfg(**model):
    return load_config(None, {"model": {"make_if_missing": None, **model}, "data": {"path": "data/train.jsonl"}})


def test_in_a_ray_job_relative_inputs_resolve_against_the_submitters_dir(tmp_path, monkeypatch):
    submit, job_copy = tmp_path / "submitter", tmp_path / "ray_copy"
    (submit / "models" / "base").mkdir(parents=True)
    (submit / "data").mkdir()
    (submit / "data" / "train.jsonl").write_text("{}\n")
    job_copy.mkdir()
    monkeypatch.chdir(job_copy)  # the job's driver runs in Ray's temporary copy
    monkeypatch.setenv(JOB_ENV, "{}")
    monkeypatch.setenv(SUBMIT_DIR_ENV, str(submit))
    cfg = resolve_inputs(_cfg(path="models/base"))
    assert cfg.model.path == str(submit / "models" / "base") and cfg.data.path == str(submit / "data/train.jsonl")
    # to be generated (make_if_missing): there too, once, not in the copy on every submission
    made = resolve_inputs(load_config(None, {"model": {"path": "models/new", "make_if_missing": {"size": "tiny"}}}))
    assert made.model.path == str(submit / "models" / "new")
    # a hub id stays a hub id; builtin and hf: sources, absolute paths stay as given
    hub = resolve_inputs(load_config(None, {"model": {"path": "Qwen/Qwen2.5-0.5B-Instruct", "make_if_missing": None},
                                            "data": {"path": "builtin:add", "eval_path": "hf:openai/gsm8k"}}))
    assert (hub.model.path, hub.data.path, hub.data.eval_path) == ("Qwen/Qwen2.5-0.5B-Instruct", "builtin:add",
                                                                  "hf:openai/gsm8k")
    assert resolve_inputs(_cfg(path=str(tmp_path / "m"))).model.path == str(tmp_path / "m")


def test_outside_a_job_relative_inputs_resolve_against_the_current_directory(tmp_path, monkeypatch):
    monkeypatch.delenv(JOB_ENV, raising=False)
    (tmp_path / "models" / "base").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    cfg = resolve_inputs(_cfg(path="models/base"))
    assert cfg.model.path == str(tmp_path / "models" / "base")
    assert cfg.data.path == "data/train.jsonl"  # no such file here: left for the pre-flight to name
    assert Path(cfg.model.path).is_absolute()
