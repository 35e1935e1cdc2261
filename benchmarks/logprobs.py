"""Benchmark: chunked ``selective_log_softmax`` vs the naive full log-softmax + gather, on CPU.

    python benchmarks/logprobs.py [--vocab 151936 --batch 4 --seq 1024 --repeats 3 --chunk-size N]

Variants (forward only, no grad, logits already in memory):

* ``naive``: fp32 logits -> ``torch.log_softmax(logits, -1).gather(-1, idx[..., None]).squeeze(-1)``;
  bf16 logits -> ``logits.float().log_softmax(-1).gather(...)`` (what users write; it holds
  an fp32 copy *and* the fp32 log-softmax, ``2 * B*T*V*4`` bytes).
* ``selective``: ``grpo_dist.algo.selective_log_softmax`` (row chunks, fp32 per chunk).

How peak memory is measured (honestly, and including everything torch allocates outside
Python's allocator, which ``tracemalloc`` cannot see): each (variant, dtype) runs in a *fresh
subprocess*. After building the inputs and a small warm-up, the worker reads its resident set
size (``VmRSS`` in ``/proc/self/status``), resets the kernel's peak-RSS high-water mark by writing
``5`` to ``/proc/self/clear_refs`` (Linux >= 4.0), runs the op, and reads ``VmHWM``. "Peak extra"
= ``VmHWM - VmRSS_before``: the most memory the op ever had resident on top of its inputs. This
is repeated ``--repeats`` times and the maximum is reported (later repeats can only under-count
if the allocator kept freed pages, so the max is the first, fresh-process value or higher). If
``clear_refs`` is not writable, the worker falls back to ``ru_maxrss`` of the first repeat (inputs
are built chunk-wise so set-up never peaks above the steady state). Time is the minimum wall time
over the repeats (the machine is shared; the minimum is the least noisy estimate).

Max abs diff is measured against the naive output on the same logits (for bf16: against the
naive fp32 log-softmax of the bf16 values upcast).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import re
import resource
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

TARGET_MEM_RATIO = 0.15
TARGET_TIME_RATIO = 1.2
TARGET_FP32_DIFF = 1e-5


def _status_kb(field: str) -> int:
    with open("/proc/self/status") as f:
        return int(re.search(rf"{field}:\s+(\d+)", f.read()).group(1))


def _reset_peak() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _make_inputs(torch, batch: int, seq: int, vocab: int, dtype):
    g = torch.Generator().manual_seed(0)
    logits = torch.empty(batch, seq, vocab, dtype=dtype)
    for b in range(batch):  # row by row: no full-size fp32 temporary for bf16
        for s in range(0, seq, 64):
            e = min(seq, s + 64)
            logits[b, s:e] = torch.randn(e - s, vocab, generator=g).mul_(3.0).to(dtype)
    index = torch.randint(0, vocab, (batch, seq), generator=g)
    return logits, index


def _naive(torch, logits, index):
    x = logits if logits.dtype == torch.float32 else logits.float()
    return torch.log_softmax(x, -1).gather(-1, index.unsqueeze(-1)).squeeze(-1)


def worker(args) -> None:
    import torch

    from grpo_dist.algo import selective_log_softmax

    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[args.dtype]
    logits, index = _make_inputs(torch, args.batch, args.seq, args.vocab, dtype)
    if args.variant == "naive":
        fn = lambda: _naive(torch, logits, index)  # noqa: E731
    else:
        fn = lambda: selective_log_softmax(logits, index, chunk_size=args.chunk_size)  # noqa: E731
    with torch.no_grad():
        small = logits[:1, :4]
        _naive(torch, small, index[:1, :4]), selective_log_softmax(small, index[:1, :4])  # warm-up
        times, extras, out = [], [], None
        can_reset = _reset_peak()
        for rep in range(args.repeats):
            out = None
            gc.collect()
            before_kb = _status_kb("VmRSS")
            if can_reset:
                _reset_peak()
            t0 = time.perf_counter()
            out = fn()
            times.append(time.perf_counter() - t0)
            if can_reset:
                extras.append(_status_kb("VmHWM") - before_kb)
            elif rep == 0:
                extras.append(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before_kb)
        diff = 0.0
        if args.variant != "naive":
            ref = _naive(torch, logits, index)
            diff = float((out - ref).abs().max())
    print(json.dumps({
        "variant": args.variant, "dtype": args.dtype, "time_s": min(times), "times": times,
        "peak_extra_mb": max(extras) / 1024.0, "max_abs_diff": diff, "out_dtype": str(out.dtype),
        "method": "clear_refs+VmHWM" if can_reset else "ru_maxrss",
        "logits_mb": logits.numel() * logits.element_size() / 2**20,
    }))


def run_one(args, variant: str, dtype: str) -> dict:
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", variant, "--dtype", dtype,
           "--vocab", str(args.vocab), "--batch", str(args.batch), "--seq", str(args.seq),
           "--repeats", str(args.repeats)]
    if args.chunk_size is not None:
        cmd += ["--chunk-size", str(args.chunk_size)]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"worker {variant}/{dtype} failed:\n{proc.stderr}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--vocab", type=int, default=151936)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--chunk-size", type=int, default=None, help="rows per chunk (default: library default)")
    p.add_argument("--dtypes", default="fp32,bf16")
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    p.add_argument("--dtype", default="fp32", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        args.variant = args.worker
        worker(args)
        return 0

    from grpo_dist.algo.logprobs import DEFAULT_CHUNK_ELEMENTS

    rows = args.chunk_size or max(1, DEFAULT_CHUNK_ELEMENTS // args.vocab)
    print(f"B x T x V = {args.batch} x {args.seq} x {args.vocab}, chunk = {rows} rows, "
          f"repeats = {args.repeats}, torch threads = default, CPU\n")
    results = {}
    for dtype in args.dtypes.split(","):
        for variant in ("naive", "selective"):
            results[(variant, dtype)] = run_one(args, variant, dtype)
    print("| variant | dtype | time s | peak extra MB | time vs naive | mem vs naive | max abs diff |")
    print("|---|---|---|---|---|---|---|")
    for (variant, dtype), r in results.items():
        n = results[("naive", dtype)]
        print(f"| {variant} | {dtype} | {r['time_s']:.3f} | {r['peak_extra_mb']:.0f} | "
              f"{r['time_s'] / n['time_s']:.2f}x | {r['peak_extra_mb'] / max(n['peak_extra_mb'], 1e-9):.3f}x | "
              f"{r['max_abs_diff']:.2e} |")
    print(f"\nmemory method: {results[('naive', args.dtypes.split(',')[0])]['method']}")
    ok_all = True
    for dtype in args.dtypes.split(","):
        s, n = results[("selective", dtype)], results[("naive", dtype)]
        checks = [
            (f"{dtype} peak extra memory <= {TARGET_MEM_RATIO}x naive",
             s["peak_extra_mb"] <= TARGET_MEM_RATIO * n["peak_extra_mb"]),
            (f"{dtype} time <= {TARGET_TIME_RATIO}x naive", s["time_s"] <= TARGET_TIME_RATIO * n["time_s"]),
            (f"{dtype} output dtype float32", s["out_dtype"] == "torch.float32"),
        ]
        if dtype == "fp32":
            checks.append((f"fp32 max abs diff <= {TARGET_FP32_DIFF}", s["max_abs_diff"] <= TARGET_FP32_DIFF))
        for name, ok in checks:
            ok_all &= ok
            print(f"{'PASS' if ok else 'FAIL'}: {name}")
    return 0 if ok_all else 1


if __name__ == "__main__":
    sys.exit(main())
