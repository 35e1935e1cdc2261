"""The workloads of benchmarks/trl_compare.py: the models, the settings, grpo_dist's overrides, TRL's
GRPOConfig and TRL's dataset (for ``smollm2``: the very prompts grpo_dist's prompt stream yields)."""

from __future__ import annotations

import math
import os
import tempfile
import time
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MODEL_CACHE = os.path.join(ROOT, ".cache", "bench_models")

# "small": the generated 24M Llama (untrained or add-pretrained), builtin:add, correctness
WORKLOAD = dict(prompts=8, group=8, max_tokens=32, lora_r=8, lora_alpha=16,
                targets=["q_proj", "k_proj", "v_proj", "o_proj"], beta=0.04, lr=1e-4, max_model_len=64, seed=0,
                data="builtin:add", chat_template=False, reward="correctness", micro_batch=64,
                config="configs/tiny_cpu.yaml")
# "smollm2": SmolLM2-135M-Instruct on the chat word problems of configs/smollm2_cpu.yaml
SMOLLM2 = dict(prompts=8, group=8, max_tokens=64, lora_r=16, lora_alpha=32,
               targets=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"], beta=0.04,
               lr=2e-4, max_model_len=256, seed=0, data="builtin:word_problems?difficulty=1", chat_template=True,
               reward="math", micro_batch=8, config="configs/smollm2_cpu.yaml", model="pkg:smollm2-135m-instruct",
               grad_clip=1.0, betas=(0.9, 0.99))
# "calculator": multi-turn tool use, SmolLM2-135M-Instruct with its ChatML template extended to render
# tool calls (TRL's tool loop needs that; trl_bench/tool_workload.py) on builtin:tool_problems, configs/calculator_smollm2.yaml.
# Generation as TRL's loop generates: no per-turn cap (max_tokens = the trajectory's budget), a turn ends at EOS (not
# at </tool_call>: stop_after_call false), every call of a turn runs; max_turns 3 = TRL's first turn + 2 iterations.
CALCULATOR = dict(SMOLLM2, max_tokens=192, max_total_tokens=192, max_turns=3, max_parallel_calls=4, temperature=0.7,
                  beta=0.0, lr=5e-4, max_model_len=1024, data="builtin:tool_problems", chat_template=False,
                  reward="grpo_dist.envs.rewards:env_reward", config="configs/calculator_smollm2.yaml", env="calculator",
                  env_kwargs={"few_shot": True, "stop_after_call": False}, tools_block="chatml",
                  tool_model="smollm2-135m-instruct-chatml-tools")
WORKLOADS: dict[str, dict[str, Any]] = {"small": WORKLOAD, "smollm2": SMOLLM2, "calculator": CALCULATOR}
MODELS = ["untrained", "add", "smollm2", "calculator"]  # --model: the first two are the small Llama's


def resize(workload: str, prompts: int | None = None, group: int | None = None) -> dict[str, Any]:
    """``--prompts`` / ``--group``: the workload with other batch sizes, in both systems (in place; the TRL
    worker repeats it from its spec); the micro-batch shrinks to a divisor of the batch where needed."""
    w = WORKLOADS[workload]
    w.update({k: v for k, v in (("prompts", prompts), ("group", group)) if v})
    w["micro_batch"] = math.gcd(w["prompts"] * w["group"], w["micro_batch"])
    return w


def workload_of(model: str) -> str:
    """The workload of a ``--model``: ``smollm2``, ``calculator``, else ``small``."""
    return model if model in ("smollm2", "calculator") else "small"


SETTINGS: dict[str, dict[str, Any]] = {
    "trl": dict(kind="trl", use_vllm=False, label="TRL, default generation (transformers generate)"),
    "trl_vllm": dict(kind="trl", use_vllm=True, label='TRL, use_vllm vllm_mode="colocate"'),
    "trl_bf16": dict(kind="trl", use_vllm=False, precision="bf16", trl_bf16=True,
                     label="TRL, default generation, bf16=True (autocast over float32 weights)"),
    "trl_bf16w": dict(kind="trl", use_vllm=False, precision="bf16", trl_bf16=True, weights="bfloat16",
                      label="TRL, default generation, bfloat16 weights + bf16=True"),
    "sync": dict(kind="grpo", max_staleness=0, label="grpo_dist sync (max_staleness 0), 1 vLLM worker"),
    # what a user gets without choosing: model.dtype auto (bfloat16 learner on a CPU with AVX512_BF16 or
    # AMX; engines merging the adapter keep float32), trainer.max_staleness auto (0 on shared CPU cores)
    "defaults": dict(kind="grpo", max_staleness="auto", precision="fp32", learner_precision="bf16",
                     overrides=["--model.dtype", "auto"],
                     label="grpo_dist at its defaults (model.dtype auto, max_staleness auto), 1 vLLM worker"),
    "async": dict(kind="grpo", max_staleness=1, label="grpo_dist async (max_staleness 1), 1 vLLM worker"),
    "sync_bf16all": dict(kind="grpo", max_staleness=0, precision="bf16",
                         overrides=["--model.dtype", "bfloat16", "--rollout.dtype", "bfloat16"],
                         label="grpo_dist sync, 1 vLLM worker, model.dtype bfloat16 (engine and learner)"),
    "stream": dict(kind="grpo", max_staleness=0, overrides=["--rollout.streaming", "true"],
                   label="grpo_dist sync, 1 vLLM worker, rollout.streaming (each trajectory advances on its own)"),
    "sync2": dict(kind="grpo", max_staleness=0, workers=2,
                  label="grpo_dist sync (max_staleness 0), 2 vLLM workers on disjoint cores"),
    "async2": dict(kind="grpo", max_staleness=1, workers=2,
                   label="grpo_dist async (max_staleness 1), 2 vLLM workers on disjoint cores"),
    "sync2_c": dict(kind="grpo", max_staleness=0, workers=2, overrides=["--rollout.enforce_eager", "false"],
                    label="grpo_dist sync, 2 compiled vLLM workers (rollout.enforce_eager false), fp32"),
    "sync2_bf16": dict(kind="grpo", max_staleness=0, workers=2, precision="bf16", learner_precision="fp32",
                       overrides=["--rollout.dtype", "bfloat16"],
                       label="grpo_dist sync, 2 vLLM workers, generation in bfloat16 (learner float32)"),
    "sync2_bf16all": dict(kind="grpo", max_staleness=0, workers=2, precision="bf16",
                          overrides=["--model.dtype", "bfloat16", "--rollout.dtype", "bfloat16"],
                          label="grpo_dist sync, 2 vLLM workers, model.dtype bfloat16 (engines and learner)"),
    "sync2_bf16all_c": dict(kind="grpo", max_staleness=0, workers=2, precision="bf16",
                            overrides=["--model.dtype", "bfloat16", "--rollout.dtype", "bfloat16",
                                       "--rollout.enforce_eager", "false"],
                            label="grpo_dist sync, 2 compiled vLLM workers (rollout.enforce_eager false), "
                                  "model.dtype bfloat16"),
}
# stage columns of the table: (key in the per-step records, header)
STAGES = [("generate", "generate s"), ("ref_logp", "ref/old log-prob s"), ("update", "update s"),
          ("sync", "sync s"), ("score", "reward s")]


# the settings run when --settings is not given
DEFAULT_SETTINGS = {"small": [n for n in SETTINGS if n not in ("sync_bf16all", "stream")],
                    "smollm2": ["trl", "trl_bf16w", "sync", "sync_bf16all", "defaults"],
                    "calculator": ["trl", "sync", "stream"]}


def precision(name: str) -> str:
    """``fp32`` (the issue's workload) or ``bf16`` (bfloat16 anywhere: weights, autocast, generation)."""
    return SETTINGS[name].get("precision", "fp32")


def stage_precision(name: str, stage: str) -> str:
    """The precision of a stage's matrix products: the setting's, except the learner's stages (reference,
    update) of a setting that generates in bfloat16 from a float32 learner."""
    if stage in ("ref_logp", "update"):
        return SETTINGS[name].get("learner_precision", precision(name))
    return precision(name)


def model_dir(kind: str) -> str:
    """Where ``--model kind`` lives (before :func:`ensure_model`; smollm2: its ``pkg:`` source)."""
    if kind == "calculator":
        return os.path.join(MODEL_CACHE, CALCULATOR["tool_model"])
    return SMOLLM2["model"] if kind == "smollm2" else os.path.join(MODEL_CACHE, f"small-{kind}")


def ensure_model(kind: str) -> str:
    """The model directory: SmolLM2 converted from its package (grpo_dist/hub.py, cached), or the
    small generated Llama in .cache/bench_models/small-<kind> (made once; kind = untrained | add); calculator:
    SmolLM2 with a chat template that renders tool calls in .cache/bench_models/ (trl_bench/tool_workload.py, made once)."""
    if kind in ("smollm2", "calculator"):
        from grpo_dist.hub import fetch_model

        src = str(fetch_model(SMOLLM2["model"], lambda m: print(f"[trl_compare] {m}", flush=True)))
        if kind == "smollm2":
            return src
        from trl_bench.tool_workload import make_tool_model

        return make_tool_model(src, model_dir(kind), log=lambda m: print(m, flush=True),
                               tools_block=CALCULATOR["tools_block"])
    path = model_dir(kind)
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
                   workers: int = 1, workload: str = "small") -> list[str]:
    """grpo_dist's overrides of a setting, on top of the workload's base config (``config`` key)."""
    w = WORKLOADS[workload]
    if w["reward"] == "math":
        reward = "[{fn: math, weight: 1.0, kwargs: {timeout_s: 5}}]"
    else:
        reward = f'[{{fn: "{w["reward"]}", weight: 1.0}}]'
    more = []
    if "env" in w:
        from trl_bench.tool_workload import grpo_tool_overrides

        more += grpo_tool_overrides(w)
    if w["chat_template"]:
        more += ["--data.chat_template", "true"]
    if "grad_clip" in w:
        more += ["--learner.grad_clip", str(w["grad_clip"]), "--learner.betas", "[%s,%s]" % tuple(w["betas"])]
    return [
        "--output_dir", out_dir, "--model.path", model_path, "--model.dtype", "float32",
        "--model.max_model_len", str(w["max_model_len"]),
        "--lora.enabled", "true", "--lora.r", str(w["lora_r"]), "--lora.alpha", str(w["lora_alpha"]),
        "--lora.dropout", "0.0", "--lora.target_modules", "[" + ",".join(w["targets"]) + "]",
        "--data.path", w["data"], "--rollout.group_size", str(w["group"]),
        "--rollout.prompts_per_step", str(w["prompts"]), "--rollout.max_tokens", str(w["max_tokens"]),
        "--rollout.temperature", str(w.get("temperature", 1.0)), "--rollout.num_workers", str(workers),
        "--reward.functions", reward,
        "--algo.beta", str(w["beta"]), "--algo.num_iterations", "1",
        "--learner.lr", str(w["lr"]), "--learner.warmup_steps", "0", "--learner.lr_schedule", "constant",
        "--learner.micro_batch_size", str(w["micro_batch"]),
        "--learner.micro_batch_tokens", "null",  # TRL's micro-batches: a count (the recipe sets a token budget)
        "--trainer.steps", str(steps), "--trainer.max_staleness", str(max_staleness), "--trainer.seed", str(w["seed"]),
        "--trainer.eval_before_after", "false", "--trainer.eval_every", "0", "--checkpoint.every", "0",
        "--logging.wandb_mode", "disabled", "--logging.progress", "false", "--logging.sample_table_every", "0",
        "--cluster.torch_threads", "auto",  # the default (configs/tiny_cpu.yaml pins 1 for the tiny demo)
    ] + more + list(extra)


def trl_args(spec: dict[str, Any]) -> dict[str, Any]:
    """GRPOConfig keyword arguments of a TRL setting (everything else stays TRL's default; for smollm2 the
    algorithm settings TRL's defaults differ in are set to grpo_dist's: loss_type grpo (algo.agg
    seq-mean-token-mean), Adam betas, the prompt order of grpo_dist's stream: shuffle_dataset off)."""
    w = WORKLOADS[spec.get("workload", "small")]
    n = w["prompts"] * w["group"]
    args = dict(
        output_dir=spec["out_dir"], max_steps=spec["steps"], per_device_train_batch_size=w["micro_batch"],
        gradient_accumulation_steps=n // w["micro_batch"], num_generations=w["group"], generation_batch_size=n, num_iterations=1,
        max_completion_length=w["max_tokens"], temperature=w.get("temperature", 1.0), learning_rate=w["lr"],
        lr_scheduler_type="constant", warmup_steps=0, beta=w["beta"], seed=w["seed"],
        use_cpu=True, bf16=bool(spec.get("bf16", False)), fp16=False, gradient_checkpointing=spec["gradient_checkpointing"],
        logging_steps=1, report_to="none", save_strategy="no", disable_tqdm=True,
        use_vllm=spec["use_vllm"])
    if spec["use_vllm"]:
        args.update(vllm_mode="colocate", vllm_max_model_length=w["max_model_len"])
    if "grad_clip" in w:
        args.update(loss_type="grpo", epsilon=0.2, scale_rewards="group", max_grad_norm=w["grad_clip"],
                    adam_beta1=w["betas"][0], adam_beta2=w["betas"][1], shuffle_dataset=False)
    if "env" in w:
        from trl_bench.tool_workload import trl_tool_args

        args.update(trl_tool_args(w))
    return args


def prompt_rows(workload: str, model_path: str, steps: int) -> list[dict[str, Any]]:
    """The prompts of ``steps`` steps as a TRL user would load them (``prompt``, ``answer``), the same
    as grpo_dist's: ``load_prompts`` of the workload's data, the chat template rendered with the
    model's tokenizer (SmolLM2's default system prompt), in the order of grpo_dist's seeded prompt
    stream (so TRL, with shuffle_dataset off, trains on the same prompts step by step). The small
    workload keeps its first rows in file order (TRL shuffles them)."""
    from grpo_dist.data.sources import PromptStream, load_prompts

    w = WORKLOADS[workload]
    n = steps * w["prompts"]
    if "env" in w:  # conversational: the environment's opening messages (trl_bench/tool_workload.py)
        from trl_bench.tool_workload import prompt_rows as tool_rows

        return tool_rows(w, steps)
    if not w["chat_template"]:
        records = load_prompts(w["data"], limit=max(64, n))
    else:
        records = load_prompts(w["data"], split="train", chat_template=True, tokenizer=model_path)
        records = PromptStream(records, seed=w["seed"]).next_batch(n)
    return [{"prompt": r.prompt, "answer": r.columns["answer"]} for r in records]

