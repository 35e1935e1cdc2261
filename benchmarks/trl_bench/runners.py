"""The runs: one TRL setting in a fresh subprocess (``trl_compare.py --_trl-worker``), one grpo_dist setting in
this process (a real local Ray cluster, vLLM, DeepSpeed)."""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Any

from trl_bench.machine import CpuShare
from trl_bench.workloads import ROOT, SETTINGS, WORKLOADS, grpo_overrides, prompt_rows, resize, trl_args

SCRIPT = os.path.join(ROOT, "benchmarks", "trl_compare.py")


# ----------------------------------------------------------------------------- TRL (subprocess)

def trl_worker(spec_path: str, out_path: str) -> int:
    """One TRL run (in its own process): per-step wall times and stage timers to ``out_path``."""
    with open(spec_path) as f:
        spec = json.load(f)
    import torch

    torch.set_num_threads(spec["threads"])
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from grpo_dist.reward.builtin import correctness_reward
    from grpo_dist.reward.math_answer import math_reward

    w = resize(spec.get("workload", "small"), spec.get("prompts"), spec.get("group"))
    cur: dict[str, float] = {}
    tools = {}
    if "env" in w:  # multi-turn: TRL's tool loop with grpo_dist's calculator function (trl_bench/tool_workload.py)
        from grpo_dist.envs.builtin import calculator
        from trl_bench.tool_workload import calculator_answer, count_turns

        reward, tools = calculator_answer, {"tools": [calculator]}
        count_turns(GRPOTrainer, cur)
    else:
        reward = {"correctness": correctness_reward, "math": math_reward}[w["reward"]]

    def timed(cls: type, name: str, stage: str, when=None) -> None:
        orig = getattr(cls, name)

        @functools.wraps(orig)
        def wrapper(*a, **k):
            if when is not None and not when():
                return orig(*a, **k)
            t0 = time.perf_counter()
            try:
                return orig(*a, **k)
            finally:
                cur[stage] = cur.get(stage, 0.0) + time.perf_counter() - t0

        setattr(cls, name, wrapper)

    timed(GRPOTrainer, "_prepare_inputs", "prepare")  # generation + rewards + reference pass of a step
    timed(GRPOTrainer, "_generate", "generate")  # includes the vLLM weight sync
    timed(GRPOTrainer, "_calculate_rewards", "score")
    # the no-grad log-prob passes: the KL reference (and old log-probs for vLLM importance sampling)
    timed(GRPOTrainer, "_get_per_token_logps_and_entropies", "ref_logp", when=lambda: not torch.is_grad_enabled())
    if spec["use_vllm"]:
        import trl.generation.vllm_generation as vg

        timed(vg.VLLMGeneration, "sync_weights", "sync")
        # TRL builds LLM(...) without a dtype, and vLLM's CPU build turns float32 checkpoints into
        # bfloat16: the workload is fp32 in every setting
        vg.LLM = functools.partial(vg.LLM, dtype="float32")

    steps: list[dict[str, float]] = []
    step_logs: list[dict[str, Any]] = []  # TRL's per-step metrics (logging_steps=1)
    marks: dict[str, float] = {}
    share = CpuShare()

    class Clock(TrainerCallback):
        def on_train_begin(self, args, state, control, **kw):
            marks["last"] = time.perf_counter()
            share.take()
            cur.clear()

        def on_step_end(self, args, state, control, **kw):
            now = time.perf_counter()
            rec = dict(cur, step_s=now - marks["last"], **share.take())
            rec["generate"] = rec.get("generate", 0.0) - rec.get("sync", 0.0)
            rec["update"] = rec["step_s"] - rec.get("prepare", 0.0)
            if rec.get("trajectories"):
                rec["turns"] = rec.pop("turns_sum") / rec.pop("trajectories")
            steps.append(rec)
            cur.clear()
            marks["last"] = now

        def on_log(self, args, state, control, logs=None, **kw):
            if logs and "completions/mean_length" in logs:
                step_logs.append(dict(logs))
    data = Dataset.from_list(prompt_rows(spec.get("workload", "small"), spec["model"], spec["steps"]))
    tok = AutoTokenizer.from_pretrained(spec["model"])
    if "env" in w and w.get("tools_block", True) is not True:  # not Qwen2.5's own template: TRL does not
        from trl.chat_template_utils import qwen3_template  # know it by its text; its parser of Qwen2.5's calls

        tok.response_template = qwen3_template
    model = AutoModelForCausalLM.from_pretrained(spec["model"], dtype=getattr(torch, spec.get("weights", "float32")))
    peft = LoraConfig(r=w["lora_r"], lora_alpha=w["lora_alpha"], lora_dropout=0.0, target_modules=w["targets"],
                      task_type="CAUSAL_LM")
    t0 = time.perf_counter()
    trainer = GRPOTrainer(model=model, reward_funcs=[reward], args=GRPOConfig(**trl_args(spec)),
                          train_dataset=data, processing_class=tok, peft_config=peft, callbacks=[Clock()], **tools)
    setup_s = time.perf_counter() - t0
    trainer.train()
    n = w["prompts"] * w["group"]
    for rec, log in zip(steps, step_logs):
        rec["completion_len"] = float(log["completions/mean_length"])
        rec["reward"] = float(log.get("reward", float("nan")))
        if "tools/call_frequency" in log:  # tool calls per trajectory
            rec["tool_calls"] = float(log["tools/call_frequency"])
    for rec in steps:
        rec["completions"] = float(n)
        rec["tokens"] = rec.get("completion_len", float("nan")) * n
    with open(out_path, "w") as f:
        json.dump({"steps": steps, "setup_s": setup_s, "threads": torch.get_num_threads()}, f)
    return 0


def error_line(text: str) -> str:
    """The most telling line of a failed run's output (the last exception line)."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    for ln in reversed(lines):
        if ("Error" in ln or "Exception" in ln) and not ln.startswith(("File ", "raise ", "During handling")):
            return ln[:300]
    return lines[-1][:300] if lines else "no output"


def run_trl(name: str, model: str, steps: int, threads: int, gradient_checkpointing: bool, log_dir: str,
            timeout: float, workload: str = "small") -> dict[str, Any]:
    setting = SETTINGS[name]
    spec = dict(model=model, steps=steps, threads=threads, use_vllm=setting["use_vllm"], workload=workload,
                prompts=WORKLOADS[workload]["prompts"], group=WORKLOADS[workload]["group"],
                bf16=setting.get("trl_bf16", False), weights=setting.get("weights", "float32"),
                gradient_checkpointing=gradient_checkpointing, out_dir=tempfile.mkdtemp(prefix="trl_bench_"))
    spec_path, out_path = os.path.join(log_dir, f"{name}.spec.json"), os.path.join(log_dir, f"{name}.out.json")
    with open(spec_path, "w") as f:
        json.dump(spec, f)
    if os.path.exists(out_path):
        os.remove(out_path)
    env = dict(os.environ, WANDB_MODE="disabled", WANDB_DISABLED="true", OMP_NUM_THREADS=str(threads),
               TOKENIZERS_PARALLELISM="false", PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]))
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    env.pop("WANDB_SERVICE", None)
    log_path = os.path.join(log_dir, f"{name}.log")
    t0 = time.perf_counter()
    try:
        with open(log_path, "w") as log:
            p = subprocess.run([sys.executable, SCRIPT, "--_trl-worker", spec_path, out_path],
                               stdout=log, stderr=subprocess.STDOUT, env=env, cwd=ROOT, timeout=timeout)
        rc = p.returncode
    except subprocess.TimeoutExpired:
        rc = "timeout"
    wall = time.perf_counter() - t0
    with open(log_path, errors="replace") as f:
        text = f.read()
    if rc != 0 or not os.path.exists(out_path):
        return {"error": f"rc={rc}: {error_line(text)}", "log": log_path, "wall_s": wall}
    with open(out_path) as f:
        res = json.load(f)
    res.update(wall_s=wall, log=log_path)
    return res


# ----------------------------------------------------------------------------- grpo_dist (in process)

def run_grpo(name: str, config: str, model: str, steps: int, extra: list[str], workload: str = "small") -> dict[str, Any]:
    from grpo_dist.config import load_config
    from grpo_dist.run.run import Run
    from grpo_dist.train import train

    out = tempfile.mkdtemp(prefix="grpo_bench_")
    spec = SETTINGS[name]
    cfg = load_config(config, grpo_overrides(model, steps, spec["max_staleness"], out,
                                             spec.get("overrides", []) + list(extra), workers=spec.get("workers", 1),
                                             workload=workload))
    t0 = time.perf_counter()
    share = CpuShare()

    class TimedSteps:  # who used the CPUs during each step (from the end of the previous one)
        def on_step(self, run, step, metrics, groups, batch):
            metrics.update({f"bench/{k}": v for k, v in share.take().items()})

    trainer = Run(cfg, callbacks=(TimedSteps(),))
    try:
        try:
            trainer.start()
            setup_s = time.perf_counter() - t0
            share.take()
            train(trainer)
        finally:
            trainer.close()
    except Exception as e:  # a failing setting is a row of the table, not the end of the benchmark
        return {"error": f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}",
                "wall_s": time.perf_counter() - t0}
    recs = []
    for h in trainer.history:
        step, n = h["timing/step"], h.get("rollout/num_completions", float("nan"))
        # multi-turn: the sampled tokens (TRL's completions/mean_length counts only those: tool results left out)
        sampled = h.get("rollout/sampled_length_mean")
        recs.append({
            "step_s": step, "completions": n,
            "tokens": h.get("perf/tokens_per_s", float("nan")) * step if sampled is None else sampled * n,
            "completion_len": h.get("rollout/completion_length_mean", float("nan")) if sampled is None else sampled,
            "turns": h.get("rollout/turns_mean", float("nan")), "tool_calls": h.get("rollout/tool_calls_mean", float("nan")),
            "reward": h.get("rollout/reward_mean", float("nan")),
            "generate": h.get("timing/generate", 0.0) + h.get("timing/generate_wait", 0.0),
            "ref_logp": h.get("timing/learn_ref_old", float("nan")),
            "update": h.get("timing/learn_update", float("nan")),
            "learn": h.get("timing/learn", float("nan")),
            "sync": h.get("timing/sync", 0.0), "score": h.get("timing/score", 0.0),
            "learner_tflops": h.get("perf/learner_tflops", float("nan")), "mfu": h.get("perf/mfu", float("nan")),
            **{k: h.get(f"bench/{k}", float("nan")) for k in ("machine_cpu", "own_cpu", "others_cpu")},
        })
    try:  # the machine-dependent defaults the run took (rollout.adapter_mode auto, ...), where the tree has them
        from grpo_dist.devices import choices

        chosen = choices(cfg)
    except Exception:
        chosen = []
    learners = trainer.info.get("learner") or [{}]  # the GEMM roof the learner measured (perf/mfu's peak)
    roof = learners[0].get("peak_tflops") if isinstance(learners, list) else None
    return {"steps": recs, "setup_s": setup_s, "threads": cfg.cluster.torch_threads, "choices": chosen,
            "learner_roof_tflops": roof, "learner_threads": learners[0].get("torch_threads"),
            "wall_s": time.perf_counter() - t0}

