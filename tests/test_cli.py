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
    assert not [ln for ln in r.stdout.splitlines() if not ln.startswith(("algo.", " "))]  # that section only
    r = cli("train", "--help-config", "algorithm")
    assert r.returncode == 2 and r.stderr.startswith("config error: --help-config: unknown section 'algorithm'")


def test_version():
    from grpo_dist import __version__

    r = cli("--version")
    assert r.returncode == 0 and r.stdout.strip() == f"grpo-dist {__version__}"


def test_a_trl_name_and_a_near_miss_get_our_key_through_the_cli():
    r = cli("train", "--config", "configs/tiny_cpu.yaml", "--num_generations", "8")
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == ["config error: num_generations: unknown key: this is rollout.group_size "
                                             "(TRL; G, completions per prompt)"]
    r = cli("train", "--config", "configs/tiny_cpu.yaml", "--trainer.step", "8")
    assert r.returncode == 2 and r.stderr.strip() == ("config error: trainer.step: unknown key; did you mean "
                                                      "trainer.steps?")


def test_help_config_lists_allowed_values_and_yaml_defaults():
    import typing

    from grpo_dist.config import Config

    r = cli("train", "--help-config")
    assert r.returncode == 0, r.stderr
    blocks: dict[str, list[str]] = {}
    head = ""
    for line in r.stdout.splitlines():
        if line.startswith(" "):
            blocks[head].append(line.strip())
        else:
            head, _, default = line.partition(" = ")
            blocks[head] = [default]
    assert blocks["rollout.backend"][0] == "vllm" and blocks["rollout.backend"][-1] == "one of: vllm, hf"
    assert blocks["model.dtype"][-1] == "one of: auto, float32, bfloat16, float16, null"
    assert blocks["trainer.max_staleness"][-1] == "an integer, or auto"
    assert blocks["lora.target_modules"][0] == "[q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj]"
    assert blocks["reward.functions"][0] == "[{name: null, fn: correctness, weight: 1.0, kwargs: {}}]"
    assert blocks["learner.betas"][0] == "[0.9, 0.99]" and blocks["data.path"][0] == "builtin:add"

    def literals(t):
        return typing.get_origin(t) is typing.Literal or any(literals(a) for a in typing.get_args(t))

    enumerated = [f"{s}.{k}" for s, f in Config.model_fields.items()
                  for k, ff in (getattr(f.annotation, "model_fields", None) or {}).items() if literals(ff.annotation)]
    assert len(enumerated) >= 20
    for key in enumerated:  # every enumerated field lists its values
        last = blocks[key][-1]
        assert last.startswith(("one of: ", "an integer, or ")), (key, last)
