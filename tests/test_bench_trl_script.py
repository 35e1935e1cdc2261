"""benchmarks/trl_compare.py: the command line and the summary, without TRL, Ray or vLLM (fast)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from scripts import load_script

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "benchmarks", "trl_compare.py")


@pytest.fixture(scope="module")
def tc():
    return load_script(SCRIPT)


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
    # "defaults": nothing pinned that a user would not pin (the dtype and the staleness left to auto)
    from grpo_dist.config import load_config

    d = tc.grpo_overrides("/nonexistent/model", 4, tc.SETTINGS["defaults"]["max_staleness"], "/tmp/out",
                          tc.SETTINGS["defaults"]["overrides"])
    cfg = load_config("configs/tiny_cpu.yaml", d + ["--model.make_if_missing", "null"])
    from grpo_dist.config.root import auto_dtype

    assert cfg.model.dtype == auto_dtype(False)[0] and cfg.model._auto_dtype
    assert cfg.trainer.max_staleness == 0 and cfg.trainer._auto_staleness
    two = load_config(os.path.join(ROOT, "configs", "tiny_cpu.yaml"),
                      tc.grpo_overrides("/nonexistent/model", 4, 0, "/tmp/out", [], workers=2))
    assert two.rollout.num_workers == 2 and two.trainer.max_staleness == 0

    def setting_config(name, workers=1):  # a grpo_dist setting's config, as run_grpo builds it
        return load_config(os.path.join(ROOT, "configs", "tiny_cpu.yaml"), tc.grpo_overrides(
            "/nonexistent/model", 4, 0, "/tmp/out", tc.SETTINGS[name].get("overrides", []), workers=workers))

    bf16 = setting_config("sync2_bf16")
    assert bf16.rollout.dtype == "bfloat16" and bf16.model.dtype == "float32"
    both = setting_config("sync2_bf16all")
    # named: a bf16 learner's merged adapter would otherwise get a float32 engine (devices.engine_dtype)
    assert both.model.dtype == "bfloat16" and both.rollout.dtype == "bfloat16"
    assert [n for n in tc.SETTINGS if tc.precision(n) == "bf16"] == ["trl_bf16", "trl_bf16w", "sync_bf16all",
                                                                       "sync2_bf16", "sync2_bf16all", "sync2_bf16all_c"]
    assert args.config.endswith("tiny_cpu.yaml") and "sync_bf16all" not in tc.parse([])[0].settings
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


def test_smollm2_workload_trl_gets_grpo_dists_prompts(tc, smollm2_dir):
    """--model smollm2: the settings parse, both systems get the same algorithm settings, and TRL's
    dataset (prompt_rows; shuffle_dataset off) holds step by step the prompts grpo_dist's seeded
    stream yields from its config: the same chat-rendered text (SmolLM2's default system prompt)
    and answers."""
    from grpo_dist.config import load_config
    from grpo_dist.data.sources import PromptStream
    from grpo_dist.run import preflight

    steps, model = 3, str(smollm2_dir)
    args, extra = tc.parse(["--model", "smollm2", "--steps", str(steps), "--skip", "1", "--rounds", "1"])
    assert args.settings == ["trl", "trl_bf16w", "sync", "sync_bf16all", "defaults"] and args.workload == "smollm2"
    assert args.config.endswith(os.path.join("configs", "smollm2_cpu.yaml"))
    assert tc.parse(["--model", "smollm2", "--settings", "sync", "--steps", "2", "--skip", "1"])[0].settings == ["sync"]

    def config(name):
        spec = tc.SETTINGS[name]
        return load_config(args.config, tc.grpo_overrides(model, steps, spec["max_staleness"], "/tmp/out",
                                                          spec.get("overrides", []) + extra, workload="smollm2"))

    cfg = config("sync")
    assert cfg.model.dtype == "float32" and config("sync_bf16all").model.dtype == "bfloat16"
    assert (cfg.lora.r, cfg.lora.alpha, cfg.lora.dropout) == (16, 32, 0.0)
    assert cfg.lora.target_modules == ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    assert (cfg.rollout.prompts_per_step, cfg.rollout.group_size, cfg.rollout.max_tokens) == (8, 8, 64)
    assert cfg.rollout.temperature == 1.0 and cfg.data.chat_template and cfg.data.system_prompt is None
    assert [f.fn for f in cfg.reward.functions] == ["math"] and cfg.data.path == "builtin:word_problems?difficulty=1"

    a = tc.trl_args(dict(out_dir="o", steps=steps, use_vllm=False, gradient_checkpointing=False, bf16=True,
                         workload="smollm2"))
    assert a["per_device_train_batch_size"] == cfg.learner.micro_batch_size == 8
    assert a["gradient_accumulation_steps"] * 8 == a["generation_batch_size"] == 64 and a["num_generations"] == 8
    assert (a["max_completion_length"], a["temperature"], a["beta"], a["num_iterations"]) == (
        cfg.rollout.max_tokens, cfg.rollout.temperature, cfg.algo.beta, cfg.algo.num_iterations)
    assert (a["learning_rate"], a["lr_scheduler_type"], a["warmup_steps"]) == (cfg.learner.lr, "constant", 0)
    assert cfg.learner.lr_schedule == "constant" and cfg.learner.warmup_steps == 0
    assert a["loss_type"] == "grpo" and cfg.algo.agg == "seq-mean-token-mean"  # TRL's grpo = our seq-mean-token-mean
    assert a["scale_rewards"] == cfg.algo.adv_scale == "group" and a["epsilon"] == cfg.algo.clip_low == cfg.algo.clip_high
    assert (a["adam_beta1"], a["adam_beta2"]) == tuple(cfg.learner.betas) and a["max_grad_norm"] == cfg.learner.grad_clip
    assert a["bf16"] and not a["gradient_checkpointing"] and a["shuffle_dataset"] is False
    assert tc.SETTINGS["trl_bf16w"]["weights"] == "bfloat16" and tc.SETTINGS["trl_bf16w"]["trl_bf16"]
    assert "weights" not in tc.SETTINGS["trl"] and not tc.SETTINGS["trl"].get("trl_bf16")

    # grpo_dist's prompts, as Run.start takes them (pre-flight, then the seeded stream)
    train, _ = preflight.prepared_data(cfg, log_fn=lambda *a: None)
    stream = PromptStream(train, seed=cfg.trainer.seed, shuffle=cfg.data.shuffle)
    grpo = [r for _ in range(steps) for r in stream.next_batch(cfg.rollout.prompts_per_step)]
    rows = tc.prompt_rows("smollm2", model, steps)
    assert [r["prompt"] for r in rows] == [r.prompt for r in grpo] and len(rows) == 24
    assert [r["answer"] for r in rows] == [r.columns["answer"] for r in grpo]
    assert len({r["prompt"] for r in rows}) == 24  # 3 steps of 8 distinct prompts
    p = rows[0]["prompt"]
    assert p.startswith("<|im_start|>system\n") and p.endswith("<|im_start|>assistant\n") and "\\boxed{}" in p


def test_floor_columns(tc):
    """measured / floor per stage: FLOPs (2NT generate, 2NT reference, 4NT update) over the roof of the
    stage's precision; the table gets the columns and the report the floors line."""
    floor = {"params": 1e8, "roofs": {"fp32": 1e11, "bf16": 2e11}, "threads": 2, "prompt_tokens": [600] * 3}
    rec = dict(step_s=40.0, completions=64.0, tokens=4000.0, completion_len=62.5, generate=18.4, ref_logp=9.2,
               update=36.8, sync=0.0, score=0.0, others_cpu=0.0)
    doc = {"steps": 3, "skip": 1, "rounds": 1, "model": "smollm2", "settings": ["sync", "sync_bf16all"],
           "runs": {n: [{"steps": [dict(rec) for _ in range(3)], "threads": "auto"}] for n in ("sync", "sync_bf16all")},
           "floor": floor, "workload": tc.WORKLOADS["smollm2"], "cpu": {"model": "x", "cores": 2, "avx2": True,
           "avx512f": True, "amx": False}, "versions": {}, "trl_threads": 2, "grpo_dist_tree": "t",
           "started": "s", "uptime_start": "u", "uptime_end": "u"}
    text = tc.render(doc, 0.1)
    fp32, bf16 = doc["summary"]["sync"], doc["summary"]["sync_bf16all"]
    # T = 600 + 4000 = 4600 tokens: floors 9.2 s (2NT at 1e11), 9.2 s, 18.4 s in fp32; half that in bf16
    assert (fp32["generate_x"], fp32["ref_logp_x"], fp32["update_x"]) == pytest.approx((2.0, 1.0, 2.0))
    assert (bf16["generate_x"], bf16["ref_logp_x"], bf16["update_x"]) == pytest.approx((4.0, 2.0, 4.0))
    assert "generate x floor" in text and "update x floor" in text and "| 2.0 | 1.0 | 2.0 |" in text
    assert "Floors: N = 100.0M" in text and "fp32 100 GFLOP/s, bf16 200 GFLOP/s" in text
    # generating in bfloat16 from a float32 learner: the learner's stages at the fp32 roof
    assert tc.stage_precision("sync2_bf16", "generate") == "bf16" and tc.stage_precision("sync2_bf16", "update") == "fp32"


# ----------------------------------------------------------------------------- --model calculator (issue 25)
# TRL's tool loop and grpo_dist's calculator environment get the same model, template, opening tokens, prompts
# and limits (TRL's own template checks run where TRL is installed)

@pytest.fixture(scope="module")
def tool_model(tc, smollm2_dir, tmp_path_factory):
    from trl_bench.tool_workload import make_tool_model

    dst = str(tmp_path_factory.mktemp("bench_models") / "smollm2-qwen2_5")
    plain = tc.WORKLOADS["calculator"]["tools_block"]
    assert make_tool_model(str(smollm2_dir), dst, log=lambda *a: None, tools_block=plain) == dst
    assert make_tool_model(str(smollm2_dir), dst, log=lambda *a: None, tools_block=plain) == dst  # kept: made once
    return dst


def test_calculator_settings_match(tc):
    """Both systems' limits and algorithm settings: TRL's budget = rollout.max_total_tokens, its
    iterations = max_turns - 1, the same temperature, lr, beta, LoRA; grpo_dist's environment as
    TRL's loop generates (no per-turn cap, no stop at </tool_call>)."""
    from grpo_dist.config import load_config

    args, extra = tc.parse(["--model", "calculator", "--steps", "3", "--skip", "1", "--rounds", "1"])
    assert args.workload == "calculator" and args.settings == ["trl", "sync", "stream"]
    assert args.config.endswith(os.path.join("configs", "calculator_smollm2.yaml"))

    def config(name):
        spec = tc.SETTINGS[name]
        return load_config(args.config, tc.grpo_overrides("/m", 3, spec["max_staleness"], "/tmp/out",
                                                          spec.get("overrides", []) + extra, workload="calculator"))

    cfg, stream = config("sync"), config("stream")
    r = cfg.rollout
    assert not r.streaming and stream.rollout.streaming and r.env == "calculator" and r.max_turns == 3
    assert r.env_kwargs == {"few_shot": True, "stop_after_call": False}
    assert r.max_tokens == r.max_total_tokens == 192 and r.max_parallel_calls == 4
    assert [f.fn for f in cfg.reward.functions] == ["grpo_dist.envs.rewards:env_reward"]
    a = tc.trl_args(dict(out_dir="o", steps=3, use_vllm=False, gradient_checkpointing=False, workload="calculator"))
    assert a["max_completion_length"] == r.max_total_tokens and a["max_tool_calling_iterations"] == r.max_turns - 1
    assert (a["temperature"], a["learning_rate"], a["beta"]) == (r.temperature, cfg.learner.lr, cfg.algo.beta) == (
        0.7, 5e-4, 0.0)
    assert a["num_generations"] == r.group_size and a["generation_batch_size"] == r.group_size * r.prompts_per_step
    assert a["per_device_train_batch_size"] == cfg.learner.micro_batch_size and a["shuffle_dataset"] is False
    assert (cfg.lora.r, cfg.lora.alpha, cfg.model.dtype) == (16, 32, "float32")


def test_same_opening_tokens_and_prompts(tc, tool_model):
    """TRL's dataset rows, rendered as TRL renders them (after the datasets round trip, tools=[calculator]
    through the Qwen2.5 template), give the very ids grpo_dist's environment opens with, for the
    prompts grpo_dist's pre-flight (which checks the template) and seeded stream yield, in order."""
    from datasets import Dataset
    from transformers import AutoTokenizer

    from grpo_dist.config import load_config
    from grpo_dist.data.sources import PromptStream
    from grpo_dist.envs.builtin import calculator
    from grpo_dist.envs.chat import encode_opening
    from grpo_dist.run import preflight
    from trl_bench.tool_workload import calculator_env, template_text

    steps = 2
    w = tc.WORKLOADS["calculator"]
    cfg = load_config(os.path.join(ROOT, w["config"]), tc.grpo_overrides(tool_model, steps, 0, "/tmp/out", [],
                                                                         workload="calculator"))
    train, _ = preflight.prepared_data(cfg, log_fn=lambda *a: None)  # the template check passes
    stream = PromptStream(train, seed=cfg.trainer.seed, shuffle=cfg.data.shuffle)
    grpo = [r for _ in range(steps) for r in stream.next_batch(cfg.rollout.prompts_per_step)]
    rows = tc.prompt_rows("calculator", tool_model, steps)
    assert [r["answer"] for r in rows] == [r.columns["answer"] for r in grpo] and len(rows) == 16
    tok = AutoTokenizer.from_pretrained(tool_model)
    assert tok.chat_template == template_text(w["tools_block"])
    env = calculator_env(w)
    data = Dataset.from_list(rows)
    for i, rec in enumerate(grpo[:4]):
        trl_ids = tok.apply_chat_template(data[i]["prompt"], tools=[calculator], add_generation_prompt=True,
                                          tokenize=True, return_dict=True)["input_ids"]
        assert trl_ids == encode_opening(tok, env.reset(rec), env.tools, env.parser)
    text = tok.decode(trl_ids)
    # the short call format and one worked call (the template states no schema: SmolLM2 calls under this one)
    assert '"name": "calculator"' in text and "<tools>" not in text and "<|im_start|>tool\n436<|im_end|>" in text
    assert text.endswith("Use the calculator.<|im_end|>\n<|im_start|>assistant\n")


def test_trl_accepts_the_template(tool_model):
    trl = pytest.importorskip("trl")
    from transformers import AutoTokenizer
    from trl.chat_template_utils import (
        add_response_schema, is_chat_template_prefix_preserving, parse_response, qwen2_5_chat_template, qwen3_template,
        supports_tool_calling)

    from trl_bench.tool_workload import template_text

    assert template_text() == qwen2_5_chat_template, f"TRL {trl.__version__} changed its Qwen2.5 template"
    tok = AutoTokenizer.from_pretrained(tool_model)
    assert supports_tool_calling(tok) and is_chat_template_prefix_preserving(tok)
    tok.chat_template = template_text()
    add_response_schema(tok)  # raises on a template TRL does not know; the worker sets this parser for the plain one
    assert tok.response_template == qwen3_template
    call = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "23 * 17"}}\n</tool_call><|im_end|>'
    prefix = tok("<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\n")["input_ids"]  # TRL passes the prompt
    out = parse_response(tok, tok(call)["input_ids"], prefix=prefix)
    assert out["tool_calls"][0]["function"] == {"name": "calculator", "arguments": {"expression": "23 * 17"}}


def test_trl_reward_scores_the_final_answer(tc):
    from trl_bench.tool_workload import calculator_answer

    call = {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {
        "name": "calculator", "arguments": {"expression": "2 + 3"}}}]}
    done = [call, {"role": "tool", "name": "calculator", "content": "5"}, {"role": "assistant", "content": "It is 5."}]
    assert calculator_answer([done, done[:1], [{"role": "assistant", "content": "6"}], []], ["5", "5", "5", "5"]) == [
        1.0, 0.0, 0.0, 0.0]


def test_multi_turn_table(tc):
    """Multi-turn records (turns present): trajectories/s, sampled tokens and turns / tool calls per trajectory."""
    def rec(step_s, turns, calls):
        return dict(step_s=step_s, completions=64.0, tokens=3200.0, completion_len=50.0, turns=turns, tool_calls=calls,
                    generate=1.0, ref_logp=0.0, update=2.0, sync=0.0, score=0.0, others_cpu=0.0)

    summary = {"trl": tc.summarise([{"steps": [rec(20.0, 2.0, 1.0)] * 3}], skip=1),
               "stream": tc.summarise([{"steps": [rec(10.0, 2.5, 1.5)] * 3}], skip=1)}
    text = tc.table(summary, rounds=1)
    assert "| trajectories/s | sampled tokens/s | sampled tokens/traj | turns/traj | tool calls/traj |" in text
    assert "| 6.40 | 320 | 50.0 | 2.50 | 1.50 |" in text and "| 3.20 | 160 | 50.0 | 2.00 | 1.00 |" in text
    assert tc.ratios(summary)[2]["stream"]["completions_per_s"] == pytest.approx(2.0)
    assert "mean len" in tc.table({"trl": summary["trl"] | {"turns": float("nan")}}, rounds=1)


def test_resize_both_systems(tc, monkeypatch):
    """--prompts / --group change the batch of both systems (the TRL worker repeats it from its spec)."""
    for name in ("calculator", "small"):
        monkeypatch.setitem(tc.WORKLOADS, name, dict(tc.WORKLOADS[name]))
    args, _ = tc.parse(["--model", "calculator", "--prompts", "4", "--group", "4", "--steps", "3", "--skip", "1"])
    ov = tc.grpo_overrides("/m", 3, 0, "/tmp/out", [], workload="calculator")
    assert ov[ov.index("--rollout.prompts_per_step") + 1] == ov[ov.index("--rollout.group_size") + 1] == "4"
    a = tc.trl_args(dict(out_dir="o", steps=3, use_vllm=False, gradient_checkpointing=False, workload="calculator"))
    assert (a["generation_batch_size"], a["num_generations"], a["per_device_train_batch_size"]) == (16, 4, 8)
    assert a["gradient_accumulation_steps"] == 2
    assert tc.resize("small", 2, 4)["micro_batch"] == 8  # 64 does not divide a batch of 8
    with pytest.raises(SystemExit):
        tc.parse(["--group", "1"])
