"""GPU check (``make gpu-check``): the project's real ``Learner`` alone on one GPU, and the
selective log-softmax at a real vocabulary.

    python benchmarks/gpu_check.py [--batch 32 --prompt 256 --completion 768 --micro 8 --steps 5]
                                   [--zero 2 --lora-r 16 --beta 0.04 --json out.json]

1. Learner: ``grpo_dist.learner.Learner`` (no Ray: it is a plain class) with DeepSpeed ZeRO-2,
   bf16, LoRA on every linear layer, NCCL (world 1), on a *randomly initialised* model of
   Qwen2-0.5B's shape (the config values are written below; nothing is downloaded). Random
   ``TrainBatch``es of equal-length prompts + completions (no padding, so every token counts),
   ``--warmup`` untimed steps, then ``--steps`` timed ``train_step`` calls. Prints tokens/s
   (prompt + completion tokens through the model per second) and model FLOPs utilisation.

   FLOPs per step are counted for what a LoRA GRPO step computes (``mfu``): the reference
   forward (``algo.beta > 0``: adapter disabled, no grad), the policy forward, and the backward
   pass through the frozen base, which needs only activation gradients (one forward's matmul
   FLOPs; no weight gradients except LoRA's, negligible) -- attention backward counts twice its
   forward. Linear layers 2 FLOPs per weight per token; causal attention 4 * d * ctx / 2 per
   token and layer; the LM head only on the kept completion positions (``logits_to_keep``).
   ``mfu_6n`` is the full-fine-tuning convention (6 x non-embedding params x tokens), printed for
   comparison with published numbers only. Peak: ``--peak-tflops`` (default 989.4, H100/H200 SXM
   dense bf16).

2. ``grpo_dist.algo.selective_log_softmax`` vs the naive ``log_softmax(logits.float()).gather``
   at V = 151936, B x T = 4 x 1024, bf16 and fp32 logits, forward (no grad) and forward +
   backward: median time over ``--repeats`` (CUDA events) and peak extra memory
   (``torch.cuda.max_memory_allocated`` above the inputs, after ``reset_peak_memory_stats``).

``--tiny`` runs a small shape (and allows CPU: gloo, float32) as a smoke test of the script.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

# Qwen2-0.5B's config.json (the model architecture; weights are random here).
QWEN2_0_5B = dict(
    architectures=["Qwen2ForCausalLM"], model_type="qwen2", vocab_size=151936, hidden_size=896,
    intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
    hidden_act="silu", max_position_embeddings=131072, rms_norm_eps=1e-6, rope_theta=1000000.0,
    tie_word_embeddings=True, use_sliding_window=False, sliding_window=131072, max_window_layers=24,
    attention_dropout=0.0, initializer_range=0.02, bos_token_id=151643, eos_token_id=151643,
)
TINY = dict(QWEN2_0_5B, vocab_size=1024, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
            bos_token_id=1, eos_token_id=2)
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


# ------------------------------------------------------------------------------ FLOPs

def linear_params(mc: dict) -> int:
    """Weights of the matmuls in the transformer body (embedding and LM head excluded)."""
    d, ff, h, kv = mc["hidden_size"], mc["intermediate_size"], mc["num_attention_heads"], mc["num_key_value_heads"]
    hd = d // h
    attn = d * h * hd + 2 * d * kv * hd + h * hd * d  # q, k, v, o
    return mc["num_hidden_layers"] * (attn + 3 * d * ff)


def step_flops(mc: dict, batch: int, prompt: int, completion: int, ref_pass: bool) -> dict[str, float]:
    d, L, V = mc["hidden_size"], mc["num_hidden_layers"], mc["vocab_size"]
    seq = prompt + completion
    tokens = batch * seq
    lin = 2.0 * linear_params(mc) * tokens
    attn = L * 4.0 * d * batch * seq * (seq + 1) / 2.0  # QK^T and AV, causal
    head = 2.0 * d * V * batch * (completion + 1)  # logits_to_keep = completion span (+1 shift)
    fwd = lin + attn + head
    bwd = lin + 2 * attn + head  # activation gradients only (frozen base)
    total = fwd * (2 if ref_pass else 1) + bwd
    six_n = 6.0 * (linear_params(mc) + d * V) * tokens
    return {"tokens": float(tokens), "lora_step_flops": total, "six_n_flops": six_n}


# ------------------------------------------------------------------------------ learner

def make_model_dir(mc: dict, dtype: str, out: str) -> float:
    import torch
    from transformers import AutoModelForCausalLM, Qwen2Config

    t0 = time.perf_counter()
    torch.manual_seed(0)
    cfg = Qwen2Config(**{k: v for k, v in mc.items() if k not in ("architectures", "model_type")})
    cfg.architectures = mc["architectures"]
    model = AutoModelForCausalLM.from_config(cfg, dtype=getattr(torch, dtype))
    model.save_pretrained(out)
    return time.perf_counter() - t0


def random_batch(n: int, prompt: int, completion: int, vocab: int, seed: int):
    from grpo_dist.types import TrainBatch

    rng = random.Random(seed)
    return TrainBatch(
        prompt_ids=[[rng.randrange(3, vocab) for _ in range(prompt)] for _ in range(n)],
        completion_ids=[[rng.randrange(3, vocab) for _ in range(completion)] for _ in range(n)],
        behaviour_logprobs=[], advantages=[rng.gauss(0.0, 1.0) for _ in range(n)])


def run_learner(args, mc: dict, gpu: bool) -> dict:
    import torch

    from grpo_dist.util.ports import free_port
    from grpo_dist.config import config_from_dict
    from grpo_dist.learner import Learner

    dtype = "bfloat16" if gpu else "float32"
    group = 8 if args.batch % 8 == 0 else 2
    with tempfile.TemporaryDirectory(prefix="gpu_check_model_") as model_dir:
        t_model = make_model_dir(mc, dtype, model_dir)
        cfg = config_from_dict(dict(
            model={"path": model_dir, "dtype": dtype, "max_model_len": args.prompt + args.completion + 1},
            lora={"r": args.lora_r, "alpha": 2 * args.lora_r, "dropout": 0.0, "target_modules": LORA_TARGETS},
            rollout={"prompts_per_step": args.batch // group, "group_size": group, "max_tokens": args.completion},
            learner={"zero_stage": args.zero, "micro_batch_size": args.micro, "lr": 1e-5,
                     "gradient_checkpointing": args.grad_ckpt},
            algo={"beta": args.beta},
            cluster={"learner_gpus": 1 if gpu else 0},
            trainer={"steps": args.warmup + args.steps},
        ))
        learner = Learner(cfg, rank=0, world_size=1, master_port=free_port())
        info = learner.setup()
        backend = torch.distributed.get_backend()
        batches = [random_batch(args.batch, args.prompt, args.completion, mc["vocab_size"], s)
                   for s in range(args.warmup + args.steps)]
        for b in batches[:args.warmup]:
            learner.train_step(b)
        if gpu:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        times, metrics = [], {}
        for b in batches[args.warmup:]:
            t0 = time.perf_counter()
            metrics = learner.train_step(b)
            if gpu:
                torch.cuda.synchronize()
            times.append(time.perf_counter() - t0)
        peak = torch.cuda.max_memory_allocated() / 2**30 if gpu else float("nan")
        prof = profile_step(learner, batches[-1], gpu) if args.profile else None
        hooks = count_hooks(learner)
        learner.shutdown()
    f = step_flops(mc, args.batch, args.prompt, args.completion, ref_pass=args.beta > 0)
    t = statistics.median(times)
    peak_flops = args.peak_tflops * 1e12
    return {
        "model": f"Qwen2-0.5B shape (random init), {info['total_params'] / 1e6:.0f}M params, "
                 f"LoRA r={args.lora_r} ({info['trainable_params'] / 1e6:.2f}M trainable)",
        "backend": backend, "zero_stage": args.zero, "dtype": dtype, "batch": args.batch,
        "prompt": args.prompt, "completion": args.completion, "micro_batch": args.micro,
        "grad_accum": info["gradient_accumulation_steps"], "beta": args.beta,
        "step_s_median": t, "step_s_all": times, "tokens_per_s": f["tokens"] / t,
        "completion_tokens_per_s": args.batch * args.completion / t,
        "tflops_achieved": f["lora_step_flops"] / t / 1e12, "mfu": f["lora_step_flops"] / t / peak_flops,
        "mfu_6n": f["six_n_flops"] / t / peak_flops, "peak_mem_gib": peak,
        "setup_s": info["timing/setup"], "model_build_s": t_model,
        "loss": metrics.get("train/loss"), "kl": metrics.get("train/kl"), "grad_norm": metrics.get("train/grad_norm"),
        "hooks": hooks, "profile": prof,
    }


def count_hooks(learner) -> int:
    """Forward (pre-)hooks on the model: constant from step to step, or something leaks."""
    return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in learner.engine.module.modules()) \
        if learner.engine is not None else -1


def profile_step(learner, batch, gpu: bool) -> dict:
    """One more step under cProfile (where the host time goes) and torch.profiler (GPU busy time)."""
    import cProfile
    import io
    import pstats

    import torch

    hooks = count_hooks(learner)
    pr = cProfile.Profile()
    t0 = time.perf_counter()
    pr.enable()
    learner.train_step(batch)
    pr.disable()
    wall = time.perf_counter() - t0
    buf = io.StringIO()
    pstats.Stats(pr, stream=buf).sort_stats("tottime").print_stats(15)
    top = [ln for ln in buf.getvalue().splitlines() if ln.strip()][-16:]
    busy = None
    if gpu:
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as p:
            t1 = time.perf_counter()
            learner.train_step(batch)
            torch.cuda.synchronize()
            wall_p = time.perf_counter() - t1
        events = p.key_averages()
        busy = sum(getattr(e, "self_device_time_total", 0) for e in events) / 1e6
        kernels = sum(getattr(e, "count", 0) for e in events if getattr(e, "self_device_time_total", 0) > 0)
        busy = {"gpu_busy_s": busy, "wall_s_profiled": wall_p, "kernel_launches": kernels,
                "top_gpu": events.table(sort_by="self_device_time_total", row_limit=8, max_name_column_width=50)}
    return {"hooks_before": hooks, "cprofile_wall_s": wall, "cprofile_top": top, "gpu": busy}


# ------------------------------------------------------------------------------ log-softmax

def run_logsoftmax(args, gpu: bool) -> list[dict]:
    import torch

    from grpo_dist.algo import selective_log_softmax

    dev = torch.device("cuda" if gpu else "cpu")
    B, T, V = args.ls_batch, args.ls_seq, args.vocab

    def naive(x, idx):
        return torch.log_softmax(x.float(), -1).gather(-1, idx.unsqueeze(-1)).squeeze(-1)

    def timed(fn) -> float:
        if not gpu:
            t0 = time.perf_counter()
            fn()
            return time.perf_counter() - t0
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        torch.cuda.synchronize()
        return s.elapsed_time(e) / 1000.0

    rows = []
    for dtype_name, dtype in (("bf16", torch.bfloat16), ("fp32", torch.float32)):
        g = torch.Generator(device=dev).manual_seed(0)
        logits = (torch.randn(B, T, V, device=dev, generator=g) * 3).to(dtype)
        idx = torch.randint(0, V, (B, T), device=dev, generator=g)
        ref = naive(logits, idx)
        for mode in ("forward", "forward+backward"):
            for variant, fn in (("naive", naive), ("selective", selective_log_softmax)):
                def call():
                    if mode == "forward":
                        with torch.no_grad():
                            return fn(logits, idx)
                    x = logits.detach().requires_grad_(True)
                    out = fn(x, idx)
                    out.sum().backward()
                    return out.detach()

                call()  # warm-up
                times, extra = [], 0.0
                for _ in range(args.repeats):
                    if gpu:
                        torch.cuda.synchronize()
                        base = torch.cuda.memory_allocated()
                        torch.cuda.reset_peak_memory_stats()
                    times.append(timed(call))
                    if gpu:
                        extra = max(extra, (torch.cuda.max_memory_allocated() - base) / 2**20)
                with torch.no_grad():
                    diff = float((fn(logits, idx) - ref).abs().max()) if variant == "selective" else 0.0
                rows.append({"dtype": dtype_name, "mode": mode, "variant": variant,
                             "time_ms": 1000 * statistics.median(times), "peak_extra_mb": extra,
                             "max_abs_diff": diff})
        del logits, idx, ref
        if gpu:
            torch.cuda.empty_cache()
    for r in rows:
        n = next(x for x in rows if x["dtype"] == r["dtype"] and x["mode"] == r["mode"] and x["variant"] == "naive")
        r["time_vs_naive"] = r["time_ms"] / n["time_ms"]
        r["mem_vs_naive"] = r["peak_extra_mb"] / n["peak_extra_mb"] if n["peak_extra_mb"] > 0 else float("nan")
    return rows


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batch", type=int, default=32, help="sequences per train_step")
    p.add_argument("--prompt", type=int, default=256)
    p.add_argument("--completion", type=int, default=768)
    p.add_argument("--micro", type=int, default=8, help="learner.micro_batch_size")
    p.add_argument("--zero", type=int, default=2)
    p.add_argument("--lora-r", type=int, default=16)
    p.add_argument("--beta", type=float, default=0.04, help="KL coefficient (> 0: one reference forward per step)")
    p.add_argument("--grad-ckpt", action="store_true", help="learner.gradient_checkpointing")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--peak-tflops", type=float, default=989.4, help="dense bf16 peak of the GPU")
    p.add_argument("--vocab", type=int, default=151936)
    p.add_argument("--ls-batch", type=int, default=4)
    p.add_argument("--ls-seq", type=int, default=1024)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--profile", action="store_true", help="one more step under cProfile and torch.profiler")
    p.add_argument("--skip-learner", action="store_true")
    p.add_argument("--skip-logsoftmax", action="store_true")
    p.add_argument("--tiny", action="store_true", help="small shapes, CPU allowed (smoke test of this script)")
    p.add_argument("--json", default=None, help="also write the results here")
    args = p.parse_args()

    from grpo_dist.util.procenv import setup_env

    setup_env()
    import torch

    gpu = torch.cuda.is_available()
    if not gpu and not args.tiny:
        print("gpu-check: no CUDA device (torch.cuda.is_available() is False); --tiny runs a CPU smoke test",
              file=sys.stderr)
        return 2
    mc = QWEN2_0_5B
    if args.tiny:
        mc = TINY
        args.vocab = min(args.vocab, 4096)
        args.batch, args.prompt, args.completion, args.micro = 4, 8, 8, 2
        args.warmup, args.steps, args.ls_seq, args.repeats = 1, 2, 64, 2
    dev_name = torch.cuda.get_device_name() if gpu else "cpu"
    print(f"device: {dev_name}; torch {torch.__version__}", flush=True)
    out: dict = {"device": dev_name, "torch": torch.__version__}
    for mod in ("deepspeed", "transformers", "peft"):
        try:
            out[mod] = __import__(mod).__version__
        except Exception as e:  # noqa: BLE001
            out[mod] = f"unavailable: {e}"
    print(" ".join(f"{m} {out[m]}" for m in ("deepspeed", "transformers", "peft")), flush=True)

    if not args.skip_learner:
        r = run_learner(args, mc, gpu)
        out["learner"] = r
        print(f"\nLearner alone: {r['model']}, ZeRO-{r['zero_stage']}, {r['dtype']}, {r['backend']}; "
              f"{r['batch']} x ({r['prompt']} + {r['completion']}) tokens per step, micro-batch "
              f"{r['micro_batch']} (x{r['grad_accum']}), beta {r['beta']}")
        print(f"  step {r['step_s_median']:.3f} s (median of {len(r['step_s_all'])}: "
              f"{', '.join(f'{x:.3f}' for x in r['step_s_all'])})")
        print(f"  tokens/s {r['tokens_per_s']:.0f} (completion tokens/s {r['completion_tokens_per_s']:.0f})")
        print(f"  {r['tflops_achieved']:.1f} TFLOP/s -> MFU {100 * r['mfu']:.1f}% of {args.peak_tflops:g} "
              f"(6N convention: {100 * r['mfu_6n']:.1f}%); peak memory {r['peak_mem_gib']:.1f} GiB", flush=True)
        print(f"  loss {r['loss']:.4f} kl {r['kl']} grad_norm {r['grad_norm']}; forward hooks on the model "
              f"after the steps: {r['hooks']}", flush=True)
        pf = r.get("profile")
        if pf:
            print(f"  profile: hooks before {pf['hooks_before']}; cProfile step {pf['cprofile_wall_s']:.3f} s, "
                  "top host functions by own time:")
            print("\n".join("    " + ln for ln in pf["cprofile_top"]))
            if pf["gpu"]:
                g = pf["gpu"]
                print(f"  GPU busy {g['gpu_busy_s']:.3f} s of a {g['wall_s_profiled']:.3f} s profiled step "
                      f"({100 * g['gpu_busy_s'] / g['wall_s_profiled']:.0f}%), {g['kernel_launches']} kernels")
                print(g["top_gpu"])

    if not args.skip_logsoftmax:
        rows = run_logsoftmax(args, gpu)
        out["logsoftmax"] = rows
        print(f"\nselective_log_softmax vs naive, B x T x V = {args.ls_batch} x {args.ls_seq} x {args.vocab}, "
              f"median of {args.repeats}")
        print("| logits | pass | variant | time ms | peak extra MB | time vs naive | memory vs naive | max abs diff |")
        print("|---|---|---|---|---|---|---|---|")
        for x in rows:
            print(f"| {x['dtype']} | {x['mode']} | {x['variant']} | {x['time_ms']:.2f} | {x['peak_extra_mb']:.0f} | "
                  f"{x['time_vs_naive']:.2f}x | {x['mem_vs_naive']:.3f}x | {x['max_abs_diff']:.1e} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
