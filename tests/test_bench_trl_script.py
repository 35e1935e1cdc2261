"""benchmarks/trl_compare.py: the command line and the summary, without TRL, Ray or vLLM (fast)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "benchmarks", "trl_compare.py")


@pytest.fixture(scope="module")
def tc():
    spec = importlib.util.spec_from_file_location("trl_compare", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_help_runs():
    p = subprocess.run([sys.executable, SCRIPT, "--help"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert "--steps" in p.stdout and "--settings" in p.stdout and "--section.key" in p.stdout


def test_parse_defaults_and_overrides(tc):
    args, extra = tc.parse(["--steps", "4", "--settings", "trl,sync", "--cluster.torch_threads", "2"])
    assert args.steps == 4 and args.skip == 2 and args.rounds == 2 and args.settings == ["trl", "sync"]
    assert extra == ["--cluster.torch_threads", "2"]
    # the workload's overrides make a valid grpo_dist config; extra ones win
    from grpo_dist.config import load_config

    cfg = load_config(os.path.join(ROOT, "configs", "tiny_cpu.yaml"),
                      tc.grpo_overrides("/nonexistent/model", 4, 1, "/tmp/out", extra))
    assert cfg.lora.r == 8 and cfg.lora.target_modules == ["q_proj", "k_proj", "v_proj", "o_proj"]
    assert (cfg.rollout.group_size, cfg.rollout.prompts_per_step, cfg.rollout.max_tokens) == (8, 8, 32)
    assert cfg.rollout.num_workers == 1 and cfg.trainer.max_staleness == 1 and cfg.algo.beta == 0.04
    assert cfg.learner.lr == 1e-4 and cfg.learner.micro_batch_size == 64 and cfg.cluster.torch_threads == 2
    assert cfg.logging.wandb_mode == "disabled" and not cfg.trainer.eval_before_after
    # the two-worker settings
    assert tc.SETTINGS["sync2"]["workers"] == tc.SETTINGS["async2"]["workers"] == 2
    two = load_config(os.path.join(ROOT, "configs", "tiny_cpu.yaml"),
                      tc.grpo_overrides("/nonexistent/model", 4, 0, "/tmp/out", [], workers=2))
    assert two.rollout.num_workers == 2 and two.trainer.max_staleness == 0

    def setting_config(name, workers=1):  # a grpo_dist setting's config, as run_grpo builds it
        return load_config(os.path.join(ROOT, "configs", "tiny_cpu.yaml"), tc.grpo_overrides(
            "/nonexistent/model", 4, 0, "/tmp/out", tc.SETTINGS[name].get("overrides", []), workers=workers))

    bf16 = setting_config("sync2_bf16")
    assert bf16.rollout.dtype == "bfloat16" and bf16.model.dtype == "float32"
    both = setting_config("sync2_bf16all")
    assert both.model.dtype == "bfloat16" and both.rollout.dtype is None
    assert [n for n in tc.SETTINGS if tc.precision(n) == "bf16"] == ["trl_bf16", "trl_bf16w", "sync2_bf16",
                                                                       "sync2_bf16all", "sync2_bf16all_c"]
    # the compiled-engine settings: the eager ones plus rollout.enforce_eager false
    for eager, compiled in (("sync2", "sync2_c"), ("sync2_bf16all", "sync2_bf16all_c")):
        c, e = setting_config(compiled, workers=2), setting_config(eager, workers=2)
        assert c.rollout.enforce_eager is False and e.rollout.enforce_eager is True
        assert c.model.dtype == e.model.dtype and tc.precision(compiled) == tc.precision(eager)


@pytest.mark.parametrize("argv", [["--settings", "nope"], ["--steps", "2", "--skip", "2"],
                                  ["--rollout.no_such_key", "1"]])
def test_parse_errors(tc, argv):
    with pytest.raises(SystemExit) as e:
        tc.parse(argv)
    assert e.value.code == 2


def test_trl_args_match_the_workload(tc):
    a = tc.trl_args(dict(out_dir="o", steps=3, use_vllm=True, gradient_checkpointing=False))
    assert a["per_device_train_batch_size"] == a["generation_batch_size"] == 64 and a["num_generations"] == 8
    assert a["max_completion_length"] == 32 and a["beta"] == 0.04 and a["learning_rate"] == 1e-4
    assert a["report_to"] == "none" and a["vllm_mode"] == "colocate" and a["use_cpu"] and not a["bf16"]
    assert "vllm_mode" not in tc.trl_args(dict(out_dir="o", steps=3, use_vllm=False, gradient_checkpointing=False))
    assert tc.trl_args(dict(out_dir="o", steps=3, use_vllm=False, gradient_checkpointing=False, bf16=True))["bf16"]


def test_dry_run_prints_the_plan():
    p = subprocess.run([sys.executable, SCRIPT, "--dry-run", "--steps", "3", "--rounds", "2", "--settings", "sync,trl"],
                       capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert p.returncode == 0, p.stderr
    plan = json.loads(p.stdout)["plan"]
    assert plan == [[0, "sync"], [0, "trl"], [1, "sync"], [1, "trl"]]  # interleaved rounds


def test_summary_table_and_ratios(tc):
    def run(step_s, tokens, others=0.0, **kw):
        return {"steps": [dict(step_s=step_s, completions=64.0, tokens=tokens, completion_len=tokens / 64,
                               generate=1.0, ref_logp=0.5, update=2.0, sync=0.1, score=0.0,
                               others_cpu=others)] * 4,
                "threads": 1, "machine_busy": 0.5, **kw}

    summary = {"trl": tc.summarise([run(8.0, 1600.0)], skip=2, quiet=0.1),
               "trl_vllm": tc.summarise([{"error": "rc=1: AttributeError: boom"}], skip=2, quiet=0.1),
               "sync": tc.summarise([run(4.0, 1600.0), run(6.0, 1600.0, others=0.5)], skip=2, quiet=0.1)}
    assert summary["sync"]["s_per_step"] == 5.0 and len(summary["sync"]["per_round"]) == 2
    assert summary["trl_vllm"] == {"error": "rc=1: AttributeError: boom"}
    best, lines, ratios = tc.ratios(summary)
    assert best == "trl" and ratios["sync"]["s_per_step"] == pytest.approx(5.0 / 8.0)
    text = tc.table(summary, rounds=2)
    assert "failed: rc=1: AttributeError: boom" in text and "(4.00 / 6.00)" in text
    # the quiet view keeps only the steps other processes left alone (the second sync run was contended)
    assert summary["sync"]["quiet"]["steps"] == 2 and summary["sync"]["quiet"]["s_per_step"] == 4.0
    assert "| 4.00 |" in tc.table(summary, rounds=2, quiet=True)
    # bf16 settings are compared with the fastest TRL setting overall and with the fastest of their precision
    summary["trl_bf16w"] = tc.summarise([run(4.0, 1600.0)], skip=2, quiet=0.1)
    summary["sync2_bf16all"] = tc.summarise([run(2.0, 1600.0)], skip=2, quiet=0.1)
    best, _, overall = tc.ratios(summary)
    _, lines, same = tc.ratios(summary, same_precision=True)
    assert best == "trl_bf16w" and overall["sync"]["s_per_step"] == pytest.approx(5.0 / 4.0)
    assert same["sync"]["against"] == "trl" and same["sync"]["s_per_step"] == pytest.approx(5.0 / 8.0)
    assert same["sync2_bf16all"]["against"] == "trl_bf16w" and same["sync2_bf16all"]["tokens_per_s"] == pytest.approx(2.0)
    assert len(lines) == 2
    assert tc.error_line("x\nTraceback\n  File \"a\", line 1\nValueError: bad thing\n") == "ValueError: bad thing"
