"""The learner against this machine's matmul roof, on CPU.

    python benchmarks/learner_roof.py [--workload small|smollm2] [--steps 50]
                                      [--dtypes float32,bfloat16,bfloat16:model] [--threads 2]
                                      [--profile 5] [--json out.json]

``--workload smollm2``: SmolLM2-135M-Instruct (the packaged GGUF, converted once) at the learner
settings of configs/smollm2_cpu.yaml: 8 word problems in its chat template x 8 completions of
1..128 tokens (mean 90), LoRA r=16 (alpha 32) on every projection, beta 0 (no reference pass),
micro-batches of 8. The default, ``small``, is the workload of benchmarks/NOTES.md: the "small" generated Llama (hidden 512, 8 layers, untrained,
cached under ``$GRPO_DIST_CACHE/bench_models/small-untrained``), 8 ``add`` prompts x 8 completions
of 1..32 tokens (about 1,519 completion tokens a step, the lengths drawn anew every step),
LoRA r=8 (alpha 16) on q,k,v,o, beta 0.04 (so a reference pass runs), one 64-completion
micro-batch, packing ``auto``, dropout 0. An in-process ``Learner`` (no Ray), ``--threads`` torch
threads (default: every CPU this process may use).

``--dtypes`` takes ``model.dtype`` or ``model.dtype:lora.dtype`` (``bfloat16:model``: the adapter
in bf16 under DeepSpeed's bf16 mode; plain ``bfloat16``: the default float32 adapter on the bf16
base). Per precision it prints:

* the roof: the best square GEMM in that precision (``grpo_dist.learner.perf.matmul_roof``);
* the update (``timing/learn_update``: forward + backward + optimizer) and its FLOP/s, counted
  ``4 x non-embedding params x tokens``, as a fraction of the roof; the same for the whole step
  (reference pass included, ``perf/learner_tflops`` and ``perf/mfu`` as the learner reports them);
* step-time growth: the median step time of the first 10 timed steps against the last 10, and the
  process's resident memory after the warm-up and at the end.

Each precision runs in a fresh process (its own roof, memory and thread pool); "step CPU-s" is
the process's CPU time per step, steadier than wall time on a machine shared with other jobs, and
"step / roof, both per CPU-s" the step's FLOPs per CPU-second against the square GEMMs' FLOPs per
CPU-second (``cpu_time_roof``): the fraction a busy machine leaves intact (best with ``--threads
1``: idle OpenMP threads spinning count as CPU time).

``--profile K``: K more steps under ``torch.profiler``; prints the ops by self CPU time and the
number of host synchronisations per step (``aten::_local_scalar_dense``: every ``.item()`` /
``float(tensor)``, each a device sync on a GPU).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

WORKLOADS = {
    "small": dict(prompts=8, group=8, max_tokens=32, mean_tokens=1519 / 64, sd_tokens=6.0, lora_r=8,
                  lora_alpha=16, targets=["q_proj", "k_proj", "v_proj", "o_proj"], beta=0.04, lr=1e-4, seed=0,
                  micro_batch=64, task="add", chat=False),
    # configs/smollm2_cpu.yaml's learner: 8 word problems (chat template) x 8 completions of up to 128
    # tokens, LoRA r 16 on every projection, beta 0 (no reference pass), micro-batches of 8
    "smollm2": dict(prompts=8, group=8, max_tokens=128, mean_tokens=90.0, sd_tokens=30.0, lora_r=16,
                    lora_alpha=32, targets=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                            "down_proj"], beta=0.0, lr=5e-4, seed=0, micro_batch=8,
                    task="word_problems", chat=True),
}
WORKLOAD = dict(WORKLOADS["small"])  # the one this process runs (--workload)


def cpu_line() -> str:
    model, flags = "?", set()
    with open("/proc/cpuinfo") as f:
        for line in f:
            key, _, val = line.partition(":")
            if key.strip() == "model name" and model == "?":
                model = val.strip()
            elif key.strip() == "flags" and not flags:
                flags = set(val.split())
    have = [f for f in ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16", "amx_tile") if f in flags]
    return f"{model}; {len(os.sched_getaffinity(0))} CPUs; flags: {' '.join(have) or 'none of avx2/avx512/amx'}"


def _status_mb(key: str) -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) / 1024.0
    return float("nan")


def rss_mb() -> float:
    return _status_mb("VmRSS")


def peak_rss_mb() -> float:
    """This process's peak resident memory (VmHWM)."""
    return _status_mb("VmHWM")


def ensure_model(workload: str = "small") -> str:
    from grpo_dist.util.procenv import PROJECT_CACHE

    if workload == "smollm2":  # the packaged GGUF, converted once into the project cache
        from grpo_dist.hub import fetch_model

        return str(fetch_model("pkg:smollm2-135m-instruct"))

    path = os.path.join(str(PROJECT_CACHE), "bench_models", "small-untrained")
    if os.path.isfile(os.path.join(path, "config.json")):
        return path
    import tempfile

    from grpo_dist.models.tiny import make_tiny_model

    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = tempfile.mkdtemp(prefix="small-untrained.", dir=os.path.dirname(path))
    make_tiny_model(tmp, size="small", seed=WORKLOAD["seed"], pretrain_task=None, log=None, threads=None)
    os.replace(tmp, path)
    return path


def batches(model_dir: str, n: int):
    """``n`` seeded TrainBatches of the workload (the same prompts, new completions each)."""
    from transformers import AutoTokenizer

    import grpo_dist.data.word_problems  # noqa: F401  (registers the task)
    from grpo_dist.data.synthetic import make_task
    from grpo_dist.types import TrainBatch

    w = WORKLOAD
    tok = AutoTokenizer.from_pretrained(model_dir)
    records = make_task(w["task"], w["prompts"], seed=w["seed"])
    if w["chat"]:
        prompts = [tok(tok.apply_chat_template([{"role": "user", "content": r.prompt}], tokenize=False,
                                               add_generation_prompt=True), add_special_tokens=False)["input_ids"]
                   for r in records]
    else:
        prompts = [tok(r.prompt)["input_ids"] for r in records]
    lo, hi = 1, w["max_tokens"]
    out = []
    for s in range(n):
        rng = random.Random(1000 + s)
        ids, comps = [], []
        for p in prompts:
            for _ in range(w["group"]):
                # lengths around the workload's mean, within 1..max_tokens
                m = max(lo, min(hi, int(round(rng.gauss(w["mean_tokens"], w["sd_tokens"])))))
                ids.append(list(p))
                comps.append([rng.randrange(4, tok.vocab_size) for _ in range(m)])
        out.append(TrainBatch(prompt_ids=ids, completion_ids=comps, behaviour_logprobs=[],
                              advantages=[rng.gauss(0.0, 1.0) for _ in ids]))
    return out


def update_tokens(batch, packed: bool) -> int:
    """Real tokens through the model per pass: each prompt group's prompt once (packed) or per
    sequence (padded), plus every completion."""
    comps = sum(len(c) for c in batch.completion_ids)
    if not packed:
        return sum(len(p) for p in batch.prompt_ids) + comps
    prompts, last = 0, None
    for p in batch.prompt_ids:
        if p != last:
            prompts += len(p)
        last = p
    return prompts + comps


def cpu_time_roof(dtype, sizes=(512, 1024), reps: int = 8) -> float:
    """The GEMM roof per CPU-second: the best ``2 n^3 / (process CPU time)`` of square products
    (time other processes take from this one is not counted, so a busy machine leaves it intact)."""
    import torch

    best = 0.0
    for n in sizes:
        a, b = torch.randn(n, n).to(dtype), torch.randn(n, n).to(dtype)
        torch.mm(a, b)
        for _ in range(reps):
            c0 = time.process_time()
            torch.mm(a, b)
            best = max(best, 2.0 * n ** 3 / max(time.process_time() - c0, 1e-9))
    return best


def run_dtype(model_dir: str, spec: str, args) -> dict[str, Any]:
    """``spec``: ``model.dtype``, or ``model.dtype:lora.dtype`` (``bfloat16:model``: the adapter in bf16 too)."""
    import torch

    from grpo_dist.config import config_from_dict
    from grpo_dist.learner import Learner, perf
    from grpo_dist.util.ports import free_port

    w = WORKLOAD
    dtype, _, lora_dtype = spec.partition(":")
    cfg = config_from_dict(dict(
        model={"path": model_dir, "dtype": dtype},
        lora={"r": w["lora_r"], "alpha": w["lora_alpha"], "dropout": 0.0, "target_modules": w["targets"],
              "dtype": lora_dtype or "float32"},
        rollout={"prompts_per_step": w["prompts"], "group_size": w["group"], "max_tokens": w["max_tokens"]},
        learner={"micro_batch_size": args.micro_batch or w["micro_batch"], "lr": w["lr"], "lr_schedule": "constant",
                 "gradient_checkpointing": args.gradient_checkpointing,
                 "micro_batch_tokens": args.micro_batch_tokens or None},
        algo={"beta": w["beta"]}, trainer={"steps": args.warmup + args.steps + args.profile},
        cluster={"torch_threads": args.threads}))
    roof = perf.matmul_roof(getattr(torch, dtype))
    cpu_roof = cpu_time_roof(getattr(torch, dtype))
    learner = Learner(cfg, master_port=free_port())
    info = learner.setup()
    peak_setup = peak_rss_mb()
    params = perf.non_embedding_params(learner.engine.module)
    packed = info["packing"] != "off"
    data = batches(model_dir, args.warmup + args.steps + args.profile)
    rows = []
    for i, b in enumerate(data[:args.warmup + args.steps]):
        if i == args.warmup:
            rss0 = rss_mb()
        c0 = time.process_time()
        m = learner.train_step(b)
        cpu = time.process_time() - c0
        if i >= args.warmup:
            t = update_tokens(b, packed)
            rows.append(dict(total=m["timing/learn_total"], update=m["timing/learn_update"], cpu=cpu,
                             ref=m["timing/learn_ref_old"], tokens=t, update_flops=4.0 * params * t,
                             # update (4x) + the reference forward (2x) when beta > 0
                             step_flops=(6.0 if w["beta"] > 0 else 4.0) * params * t,
                             tflops=m.get("perf/learner_tflops"), mfu=m.get("perf/mfu"),
                             micro=m["train/micro_batches"]))
    rss1 = rss_mb()
    med = statistics.median
    res = dict(dtype=spec, roof_gflops=roof / 1e9, params=params, packing=info["packing"],
               tokens=med(r["tokens"] for r in rows), update_s=med(r["update"] for r in rows),
               ref_s=med(r["ref"] for r in rows), total_s=med(r["total"] for r in rows),
               micro_batches=med(r["micro"] for r in rows),
               cpu_s=med(r["cpu"] for r in rows), load=os.getloadavg()[0],
               cpu_gflops=med(r["step_flops"] / r["cpu"] for r in rows) / 1e9,
               update_gflops=med(r["update_flops"] / r["update"] for r in rows) / 1e9,
               step_gflops=med(r["step_flops"] / r["total"] for r in rows) / 1e9,
               first10_s=med(r["total"] for r in rows[:10]), last10_s=med(r["total"] for r in rows[-10:]),
               first10_cpu=med(r["cpu"] for r in rows[:10]), last10_cpu=med(r["cpu"] for r in rows[-10:]),
               rss_after_warmup_mb=rss0, rss_end_mb=rss1, peak_rss_mb=peak_rss_mb(), peak_setup_mb=peak_setup,
               learner_tflops=med(r["tflops"] for r in rows) if rows[0]["tflops"] is not None else None,
               learner_mfu=med(r["mfu"] for r in rows) if rows[0]["mfu"] is not None else None)
    res["update_frac"] = res["update_gflops"] / res["roof_gflops"]
    res["step_frac"] = res["step_gflops"] / res["roof_gflops"]
    # the step's FLOPs per CPU-second against the GEMMs' FLOPs per CPU-second
    res["cpu_roof_gflops"] = cpu_roof / 1e9
    res["cpu_frac"] = res["cpu_gflops"] / res["cpu_roof_gflops"]
    if args.profile:
        res["profile"] = profile(learner, data[-args.profile:])
    learner.shutdown()
    return res


def profile(learner, data) -> dict[str, Any]:
    from torch.profiler import ProfilerActivity, profile as torch_profile

    with torch_profile(activities=[ProfilerActivity.CPU]) as prof:
        for b in data:
            learner.train_step(b)
    events = prof.key_averages()
    n = len(data)
    syncs = sum(e.count for e in events if e.key == "aten::_local_scalar_dense") / n
    top = sorted(events, key=lambda e: e.self_cpu_time_total, reverse=True)[:15]
    total = sum(e.self_cpu_time_total for e in events)
    return {"host_syncs_per_step": syncs,
            "top_self_cpu": [(e.key, e.self_cpu_time_total / n / 1e3, e.count / n, e.self_cpu_time_total / total)
                             for e in top]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=50, help="timed steps per precision")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--workload", choices=sorted(WORKLOADS), default="small",
                   help="small: the generated 25M Llama; smollm2: SmolLM2-135M-Instruct at configs/smollm2_cpu.yaml's "
                        "learner settings")
    p.add_argument("--dtypes", default="float32,bfloat16")
    p.add_argument("--micro-batch", type=int, default=0, help="learner.micro_batch_size (default: the workload's)")
    p.add_argument("--gradient-checkpointing", action="store_true", help="learner.gradient_checkpointing: true")
    p.add_argument("--micro-batch-tokens", type=int, default=0,
                   help="learner.micro_batch_tokens: micro-batches by a token budget (default: by count)")
    p.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    p.add_argument("--profile", type=int, default=0, help="extra steps under torch.profiler")
    p.add_argument("--json", default=None)
    p.add_argument("--one", default=None, help=argparse.SUPPRESS)
    p.add_argument("--out", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()

    from grpo_dist.util.procenv import setup_env

    setup_env()
    import torch

    torch.set_num_threads(args.threads)
    WORKLOAD.update(WORKLOADS[args.workload])
    model_dir = ensure_model(args.workload)
    if args.one:  # one precision in this process (the parent runs each in a fresh one)
        with open(args.out, "w") as f:
            json.dump(run_dtype(model_dir, args.one, args), f)
        return
    print(f"machine: {cpu_line()}; workload {args.workload}: {WORKLOAD}", flush=True)
    print(f"torch {torch.__version__}, {args.threads} threads; load before: {os.getloadavg()}", flush=True)
    results = []
    for d in args.dtypes.split(","):
        with tempfile.NamedTemporaryFile(suffix=".json") as out:
            subprocess.run([sys.executable, os.path.abspath(__file__), *sys.argv[1:], "--one", d, "--out", out.name],
                           check=True)
            with open(out.name) as f:
                results.append(json.load(f))
    print(f"load after: {os.getloadavg()}")
    print()
    print("| dtype | roof GFLOP/s | tokens/step | micro-batches | update s | update GFLOP/s | update / roof | ref s | step s | "
          "step GFLOP/s | step / roof | perf/mfu | step CPU-s | step / roof, both per CPU-s | "
          "first-10 / last-10 step s | "
          "RSS MB warm -> end (peak) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in results:
        mfu = f"{100 * r['learner_mfu']:.0f}%" if r["learner_mfu"] is not None else "-"
        print(f"| {r['dtype']} | {r['roof_gflops']:.0f} | {r['tokens']:.0f} | {r['micro_batches']:.0f} | "
              f"{r['update_s']:.3f} | "
              f"{r['update_gflops']:.0f} | {100 * r['update_frac']:.0f}% | {r['ref_s']:.3f} | {r['total_s']:.3f} | "
              f"{r['step_gflops']:.0f} | {100 * r['step_frac']:.0f}% | {mfu} | {r['cpu_s']:.2f} | "
              f"{100 * r['cpu_frac']:.0f}% (roof {r['cpu_roof_gflops']:.0f}) | "
              f"{r['first10_s']:.3f} / {r['last10_s']:.3f} | {r['rss_after_warmup_mb']:.0f} -> {r['rss_end_mb']:.0f} "
              f"({r['peak_rss_mb']:.0f}; {r['peak_setup_mb']:.0f} after set-up) |")
    for r in results:
        growth = r["last10_s"] / r["first10_s"] - 1.0
        cpu_growth = r["last10_cpu"] / r["first10_cpu"] - 1.0
        print(f"{r['dtype']}: median step time of the last 10 vs the first 10 steps: wall {r['first10_s']:.3f} -> "
              f"{r['last10_s']:.3f} s ({100 * growth:+.1f}%), CPU {r['first10_cpu']:.3f} -> {r['last10_cpu']:.3f} s "
              f"({100 * cpu_growth:+.1f}%): {'no growth' if min(growth, cpu_growth) < 0.05 else 'GROWS'} at a 5% bound")
        if "profile" in r:
            pr = r["profile"]
            print(f"{r['dtype']} profile: {pr['host_syncs_per_step']:.0f} host syncs "
                  "(aten::_local_scalar_dense) per step")
            for key, ms, count, frac in pr["top_self_cpu"]:
                print(f"    {key:45s} {ms:8.1f} ms/step  {count:7.0f} calls/step  {100 * frac:5.1f}%")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
