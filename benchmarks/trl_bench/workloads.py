"""The workloads of benchmarks/trl_compare.py: the model, the settings, grpo_dist's overrides and TRL's GRPOConfig."""

from __future__ import annotations

import os
import tempfile
import time
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MODEL_CACHE = os.path.join(ROOT, ".cache", "bench_models")

WORKLOAD = dict(prompts=8, group=8, max_tokens=32, lora_r=8, lora_alpha=16,
                targets=["q_proj", "k_proj", "v_proj", "o_proj"], beta=0.04, lr=1e-4, max_model_len=64, seed=0)
SETTINGS: dict[str, dict[str, Any]] = {
    "trl": dict(kind="trl", use_vllm=False, label="TRL, default generation (transformers generate)"),
    "trl_vllm": dict(kind="trl", use_vllm=True, label='TRL, use_vllm vllm_mode="colocate"'),
    "trl_bf16": dict(kind="trl", use_vllm=False, precision="bf16", trl_bf16=True,
                     label="TRL, default generation, bf16=True (autocast over float32 weights)"),
    "trl_bf16w": dict(kind="trl", use_vllm=False, precision="bf16", trl_bf16=True, weights="bfloat16",
                      label="TRL, default generation, bfloat16 weights + bf16=True"),
    "sync": dict(kind="grpo", max_staleness=0, label="grpo_dist sync (max_staleness 0), 1 vLLM worker"),
    "async": dict(kind="grpo", max_staleness=1, label="grpo_dist async (max_staleness 1), 1 vLLM worker"),
    "sync2": dict(kind="grpo", max_staleness=0, workers=2,
                  label="grpo_dist sync (max_staleness 0), 2 vLLM workers on disjoint cores"),
    "async2": dict(kind="grpo", max_staleness=1, workers=2,
                   label="grpo_dist async (max_staleness 1), 2 vLLM workers on disjoint cores"),
    "sync2_c": dict(kind="grpo", max_staleness=0, workers=2, overrides=["--rollout.enforce_eager", "false"],
                    label="grpo_dist sync, 2 compiled vLLM workers (rollout.enforce_eager false), fp32"),
    "sync2_bf16": dict(kind="grpo", max_staleness=0, workers=2, precision="bf16", overrides=["--rollout.dtype", "bfloat16"],
                       label="grpo_dist sync, 2 vLLM workers, generation in bfloat16 (learner float32)"),
    "sync2_bf16all": dict(kind="grpo", max_staleness=0, workers=2, precision="bf16",
                          overrides=["--model.dtype", "bfloat16"],
                          label="grpo_dist sync, 2 vLLM workers, model.dtype bfloat16 (engines and learner)"),
    "sync2_bf16all_c": dict(kind="grpo", max_staleness=0, workers=2, precision="bf16",
                            overrides=["--model.dtype", "bfloat16", "--rollout.enforce_eager", "false"],
                            label="grpo_dist sync, 2 compiled vLLM workers (rollout.enforce_eager false), "
                                  "model.dtype bfloat16"),
}
# stage columns of the table: (key in the per-step records, header)
STAGES = [("generate", "generate s"), ("ref_logp", "ref/old log-prob s"), ("update", "update s"),
          ("sync", "sync s"), ("score", "reward s")]


def precision(name: str) -> str:
    """``fp32`` (the issue's workload) or ``bf16`` (bfloat16 anywhere: weights, autocast, generation)."""
    return SETTINGS[name].get("precision", "fp32")



def ensure_model(kind: str) -> str:
    """The small generated Llama in .cache/bench_models/small-<kind> (made once; kind = untrained | add)."""
    path = os.path.join(MODEL_CACHE, f"small-{kind}")
    if os.path.isfile(os.path.join(path, "config.json")):
        return path
    from grpo_dist.models.tiny import make_tiny_model

    os.makedirs(MODEL_CACHE, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=f"small-{kind}.", dir=MODEL_CACHE)
    t0 = time.perf_counter()
    info = make_tiny_model(tmp, size="small", seed=WORKLOAD["seed"], pretrain_task=None if kind == "untrained" else kind,
                           threads=os.cpu_count())
    os.replace(tmp, path)
    print(f"[trl_compare] made {path}: {info['num_parameters'] / 1e6:.1f}M parameters in "
          f"{time.perf_counter() - t0:.0f} s", flush=True)
    return path


def grpo_overrides(model_path: str, steps: int, max_staleness: int, out_dir: str, extra: list[str],
                   workers: int = 1) -> list[str]:
    w = WORKLOAD
    return [
        "--output_dir", out_dir, "--model.path", model_path, "--model.dtype", "float32",
        "--model.max_model_len", str(w["max_model_len"]),
        "--lora.enabled", "true", "--lora.r", str(w["lora_r"]), "--lora.alpha", str(w["lora_alpha"]),
        "--lora.dropout", "0.0", "--lora.target_modules", "[" + ",".join(w["targets"]) + "]",
        "--data.path", "builtin:add", "--rollout.group_size", str(w["group"]),
        "--rollout.prompts_per_step", str(w["prompts"]), "--rollout.max_tokens", str(w["max_tokens"]),
        "--rollout.temperature", "1.0", "--rollout.num_workers", str(workers),
        "--reward.functions", "[{fn: correctness, weight: 1.0}]",
        "--algo.beta", str(w["beta"]), "--algo.num_iterations", "1",
        "--learner.lr", str(w["lr"]), "--learner.warmup_steps", "0", "--learner.lr_schedule", "constant",
        "--learner.micro_batch_size", str(w["prompts"] * w["group"]),
        "--trainer.steps", str(steps), "--trainer.max_staleness", str(max_staleness), "--trainer.seed", str(w["seed"]),
        "--trainer.eval_before_after", "false", "--trainer.eval_every", "0", "--checkpoint.every", "0",
        "--logging.wandb_mode", "disabled", "--logging.progress", "false", "--logging.sample_table_every", "0",
        "--cluster.torch_threads", "auto",  # the default (configs/tiny_cpu.yaml pins 1 for the tiny demo)
    ] + list(extra)


def trl_args(spec: dict[str, Any]) -> dict[str, Any]:
    """GRPOConfig keyword arguments of a TRL setting (everything else stays TRL's default)."""
    w = WORKLOAD
    n = w["prompts"] * w["group"]
    args = dict(
        output_dir=spec["out_dir"], max_steps=spec["steps"], per_device_train_batch_size=n,
        gradient_accumulation_steps=1, num_generations=w["group"], generation_batch_size=n, num_iterations=1,
        max_completion_length=w["max_tokens"], temperature=1.0, learning_rate=w["lr"],
        lr_scheduler_type="constant", warmup_steps=0, beta=w["beta"], seed=w["seed"],
        use_cpu=True, bf16=bool(spec.get("bf16", False)), fp16=False, gradient_checkpointing=spec["gradient_checkpointing"],
        logging_steps=1, report_to="none", save_strategy="no", disable_tqdm=True,
        use_vllm=spec["use_vllm"])
    if spec["use_vllm"]:
        args.update(vllm_mode="colocate", vllm_max_model_length=w["max_model_len"])
    return args

