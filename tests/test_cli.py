"""The CLI: --help explains, a bad config exits 2 with one line before anything heavy starts."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def cli(*args, timeout=120):
    return subprocess.run([sys.executable, "-m", "grpo_dist.cli", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout)


def test_help_lists_commands_and_overrides():
    r = cli("--help")
    assert r.returncode == 0
    for word in ("train", "eval", "make-tiny-model", "doctor"):
        assert word in r.stdout
    r = cli("train", "--help")
    assert r.returncode == 0 and "--section.key VALUE" in r.stdout and "summary.json" in r.stdout


def test_make_tiny_model_takes_every_pretraining_option(tmp_path):
    import json

    out = tmp_path / "m"
    r = cli("make-tiny-model", str(out), "--pretrain-task", "add", "--steps", "4", "--noise", "near",
            "--clean-fraction", "0.25", "--p-correct", "0.3", "--lr", "2e-3", "--batch-size", "8", "--seed", "3",
            timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    info = json.loads((out / "tiny_model_info.json").read_text())
    assert {k: info[k] for k in ("steps", "noise", "clean_fraction", "p_correct", "lr", "batch_size", "seed")} == {
        "steps": 4, "noise": "near", "clean_fraction": 0.25, "p_correct": 0.3, "lr": 2e-3, "batch_size": 8, "seed": 3}


def test_heavy_modules_not_imported_by_config_validation():
    code = ("import sys; from grpo_dist.config import load_config; load_config('configs/tiny_cpu.yaml'); "
            "print(sorted(m for m in ('torch','ray','vllm','deepspeed') if m in sys.modules))")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert r.stdout.strip() == "[]", r.stderr


def test_print_config_shows_resolved_preset():
    r = cli("train", "--config", "configs/tiny_cpu.yaml", "--print-config", "--algo.preset", "dr_grpo")
    assert r.returncode == 0
    assert "agg: seq-mean-token-sum-norm" in r.stdout and "adv_scale: none" in r.stdout


def test_missing_model_without_make_if_missing_is_a_config_error(tmp_path):
    r = cli("train", "--config", "configs/tiny_cpu.yaml", "--model.path", str(tmp_path / "nope"),
            "--model.make_if_missing", "null", "--output_dir", str(tmp_path / "out"))
    assert r.returncode == 2
    assert "config error: model.path: no model at" in r.stderr


def test_help_config_documents_every_field():
    from grpo_dist.config import Config

    r = cli("train", "--help-config")
    assert r.returncode == 0, r.stderr
    heads = [line.split(" = ")[0] for line in r.stdout.splitlines() if not line.startswith(" ")]
    expected = [f"{s}.{k}" if hasattr(f.annotation, "model_fields") else s
                for s, f in Config.model_fields.items()
                for k in (getattr(f.annotation, "model_fields", None) or [None])]
    assert heads == expected and len(heads) > 100
    r = cli("train", "--help-config", "algo")
    assert r.returncode == 0
    assert "algo.ref_refresh_every = 0" in r.stdout and "TRL sync_ref_model" in r.stdout
    assert "rollout." not in r.stdout
    r = cli("train", "--help-config", "algorithm")
    assert r.returncode == 2 and r.stderr.startswith("config error: --help-config: unknown section 'algorithm'")
