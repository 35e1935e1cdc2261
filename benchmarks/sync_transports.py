"""Benchmark: one weight sync through each ``sync.transport``, against the machine's copy bandwidth.

    python benchmarks/sync_transports.py [--models tiny,small,smollm2,qwen05] [--kinds full,lora]
        [--engines 1,2] [--reps 3] [--transports collective,collective:16,object_store,filesystem]
        [--json out.json]

First the machine's copy bandwidth (``sync_bound.copy_bandwidth``: torch ``copy_`` of 1 GiB, best
of 5; on a GPU also host to device and device to device), in the same invocation. Then, per
model, kind, engine count and transport, one run's workers are started (real local Ray cluster,
DeepSpeed learner, vLLM CPU engines; no training) and ``--reps`` syncs of the learner's weights
are timed by the driver (``WeightSync.push(wait=True)``: learner half and every engine's load),
after one warm-up sync. ``full``: every weight travels and is loaded; ``lora``: a LoRA r 16
adapter on every projection travels, each engine merges it into its base and loads the merged
projections (``rollout.adapter_mode: merged``). ``collective``: learner rank 0 broadcasts buckets
over a gloo group (``collective:16``: 16 MiB buckets instead of 256); ``object_store``: the
learner's weights as one Ray object; ``filesystem``: one file under ``cluster.shared_dir``.

Per row: the bytes sent, the bytes each engine loads (full: the model; lora: the merged
projections), the best sync's seconds, the bytes one engine loads per second of it and that as a
fraction of the copy bandwidth, and the best sync's parts as the run logs them
(``timing/sync_publish|transfer|merge|write|load``; the collective's load includes receiving).
Peak memory: the extra resident memory at the peak of a sync (the high-water mark, reset before
it; Linux ``/proc/self/clear_refs``) of the learner process, and of each engine's processes,
summed per engine, the largest engine reported. Prints a markdown table with the machine's CPU;
the same as JSON with ``--json``.

Models (``sync_bound``): ``tiny`` = the test model's shape (0.3M parameters, fp32); ``small`` =
the 25M Llama of the other benchmarks; ``smollm2`` = SmolLM2-135M's shape; ``qwen05`` =
Qwen2-0.5B's shape; all fp32 with random weights (timing only).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

from pipeline import cpu_line  # noqa: E402
from sync_bound import LORA_TARGETS, copy_bandwidth, loaded_bytes, model_dir  # noqa: E402

from grpo_dist.util.procenv import PROJECT_CACHE  # noqa: E402

def _tree_rss(key: str) -> list[tuple[int, int]]:
    """(pid, bytes of ``key`` in /proc/<pid>/status) for this process and its descendants (an
    engine's rollout actor, its vLLM EngineCore and worker processes)."""
    import re

    import psutil

    me = psutil.Process()
    out = []
    for p in [me] + me.children(recursive=True):
        try:
            with open(f"/proc/{p.pid}/status") as f:
                out.append((p.pid, int(re.search(rf"^{key}:\s+(\d+) kB", f.read(), re.M).group(1)) * 1024))
        except (OSError, AttributeError):
            pass
    return out


def _reset_peak(*_args) -> dict[int, int]:
    """Resets the resident high-water mark of this process and its descendants; their resident
    bytes now."""
    import psutil

    me = psutil.Process()
    for p in [me] + me.children(recursive=True):
        try:
            with open(f"/proc/{p.pid}/clear_refs", "w") as f:
                f.write("5")
        except OSError:
            pass
    return dict(_tree_rss("VmRSS"))


def _read_peak(*_args) -> dict[int, int]:
    return dict(_tree_rss("VmHWM"))


class Peaks:
    """The learner's and each engine's (its processes summed) extra peak over what runs between
    ``start`` and ``stop``."""

    def __init__(self, run):
        self.actors = [run.workers.learner.actors[0]] + list(run.workers.rollout.actors)

    def start(self) -> None:
        import ray

        self._base = ray.get([a.debug_call.remote(_reset_peak) for a in self.actors])

    def stop(self) -> tuple[float, float]:
        import ray

        peaks = ray.get([a.debug_call.remote(_read_peak) for a in self.actors])
        extra = [sum(max(0, peak.get(pid, 0) - rss) for pid, rss in base.items())
                 for base, peak in zip(self._base, peaks)]
        return extra[0], max(extra[1:])


def gpu_sections(gpus: int, engines: int, transport: str) -> dict:
    """``--gpus N``: the learner on one GPU, the engines on the rest (one GPU: shared by fractions;
    NCCL refuses two ranks on one GPU, so the collective is gloo there). Written, not run."""
    if gpus <= 0:
        return {}
    one = gpus == 1
    return {"cluster": {"learner_gpus": 0.5 if one else 1, "rollout_gpus": round(0.5 / engines, 3) if one else
                        max(1, (gpus - 1) // engines), "layout": "disaggregated"},
            **({"sync": {"collective_backend": "gloo"}} if one and transport.startswith("collective") else {}),
            "rollout": {"gpu_memory_utilization": round(0.4 / engines, 3) if one else 0.8}}


def config(model: str, transport: str, engines: int, tmp: str, lora: bool = False, gpus: int = 0):
    from grpo_dist.config import load_config

    path, make = model_dir(model, PROJECT_CACHE)
    name, _, bucket = transport.partition(":")
    shared = os.path.join(tmp, "shared")
    over = {
        "output_dir": os.path.join(shared, "out"),
        "model": {"path": path, "make_if_missing": make, "max_model_len": 64 if model == "tiny" else 128},
        "lora": ({"enabled": True, "r": 16, "alpha": 32, "target_modules": list(LORA_TARGETS)} if lora
                 else {"enabled": False}),
        "rollout": {"backend": "vllm", "num_workers": engines, "cpu_kvcache_gb": 0.25,  # memory: no generation here
                    **({"adapter_mode": "merged"} if lora else {})},
        "sync": {"transport": name, **({"bucket_mb": float(bucket)} if bucket else {})},
        "cluster": {"shared_dir": shared},
        "trainer": {"steps": 1, "eval_before_after": False, "eval_every": 0},
        "checkpoint": {"every": 0},
        "algo": {"beta": 0.0},  # no reference copy of the weights: memory for the larger shapes (sync alone is timed)
        "logging": {"wandb_mode": "disabled", "progress": False, "sample_table_every": 0},
    }
    for key, section in gpu_sections(gpus, engines, transport).items():
        over[key] = {**over.get(key, {}), **section}
    if gpus:
        over["model"]["dtype"] = "bfloat16"
    return load_config(os.path.join(ROOT, "configs", "tiny_cpu.yaml"), over)


PHASES = ("publish", "transfer", "merge", "write", "load")  # timing/sync_<phase>, the best sync's


def measure(model: str, transport: str, engines: int, reps: int, lora: bool = False, gpus: int = 0) -> dict:
    from grpo_dist.run.run import Run

    with tempfile.TemporaryDirectory(prefix="grpo_sync_bench_") as tmp:
        cfg = config(model, transport, engines, tmp, lora, gpus)
        run = Run(cfg)
        try:
            run.start()
            version = run.sync.version  # the learner's (0: nothing is trained; each push sends its weights again)
            run.sync.push(version, wait=True)  # warm-up (first reload, first group use)
            secs, learner_peaks, engine_peaks, pushes = [], [], [], []
            peaks = Peaks(run)
            for _ in range(reps):
                peaks.start()
                t0 = time.perf_counter()
                pushes.append(run.sync.push(version, wait=True))
                secs.append(time.perf_counter() - t0)
                lp, ep = peaks.stop()
                learner_peaks.append(lp)
                engine_peaks.append(ep)
            info = run.info["learner"][0]
        finally:
            run.close()
    best = pushes[secs.index(min(secs))]
    return {"model": model, "kind": "lora r16 merged" if lora else "full", "transport": transport,
            "engines": engines, "params": info.get("total_params"), "mib": best.get("sync/bytes", 0) / 2**20,
            "loaded_mib": loaded_bytes(cfg.model.path, lora, 2 if gpus else 4) / 2**20, "s_per_sync": statistics.mean(secs),
            "s_min": min(secs), "learner_peak_mib": max(learner_peaks) / 2**20,
            "engine_peak_mib": max(engine_peaks) / 2**20, "buckets": best.get("sync/buckets"),
            **{p: best.get(f"timing/sync_{p}") for p in PHASES}}


def fraction(r: dict, bw: float) -> float:
    """The bytes one engine loads, per second of the best sync, over the machine's copy bandwidth."""
    return r["loaded_mib"] * 2**20 / r["s_min"] / bw


def table(rows: list[dict], bw: float) -> str:
    out = ["| model | weights | engines | transport | MiB sent | MiB loaded / engine | s/sync (min) | s/sync (mean) "
           "| GB/s / engine | of copy bw | " + " | ".join(PHASES) + " | learner extra peak MiB | engine extra peak MiB |",
           "|---" * (12 + len(PHASES)) + "|"]
    for r in rows:
        params = f" ({r['params'] / 1e6:.3g}M)" if r.get("params") else ""
        ph = " | ".join("–" if r.get(p) is None else f"{r[p]:.3f}" for p in PHASES)
        out.append(f"| {r['model']}{params} | {r['kind']} | {r['engines']} | {r['transport']} | {r['mib']:.1f} | "
                   f"{r['loaded_mib']:.1f} | {r['s_min']:.3f} | {r['s_per_sync']:.3f} | "
                   f"{r['loaded_mib'] * 2**20 / r['s_min'] / 1e9:.2f} | **{100 * fraction(r, bw):.1f}%** | {ph} | "
                   f"{r['learner_peak_mib']:.0f} | {r['engine_peak_mib']:.0f} |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 2)[2],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="tiny,small", help="tiny, small, smollm2, qwen05 (comma-separated)")
    ap.add_argument("--kinds", default="full", help="full, lora (LoRA r 16 on every projection, merged serving)")
    ap.add_argument("--transports", default="collective,object_store,filesystem")
    ap.add_argument("--engines", default="2", help="engine counts, comma-separated")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--gpus", type=int, default=0, help="GPUs of this machine to use (bfloat16; written, not run)")
    ap.add_argument("--json", default=None)
    ap.add_argument("--retries", type=int, default=2, help="runs started again after the node ran out of memory")
    args = ap.parse_args(argv)
    bw = copy_bandwidth()
    print("copy bandwidth: " + ", ".join(f"{k} {v / 1e9:.1f} GB/s" for k, v in bw.items()), flush=True)
    rows = []
    for model in args.models.split(","):
        for kind in args.kinds.split(","):
            for engines in [int(e) for e in args.engines.split(",")]:
                for transport in args.transports.split(","):
                    t0 = time.perf_counter()
                    for attempt in range(args.retries + 1):  # a shared machine: the node may run out of memory
                        try:
                            rows.append(measure(model, transport, engines, args.reps, kind == "lora", args.gpus))
                            break
                        except Exception as e:
                            oom = "OutOfMemoryError" in f"{type(e).__name__} {e}" or "low on memory" in str(e)
                            if attempt == args.retries or not oom:
                                raise
                            print(f"{model} {transport}: {str(e)[:120]}...; again in 60 s", flush=True)
                            time.sleep(60)
                    print(f"{model} {kind} x{engines} {transport}: {rows[-1]['s_min']:.3f} s/sync, "
                          f"{100 * fraction(rows[-1], bw['host']):.1f}% of copy bw "
                          f"({time.perf_counter() - t0:.0f} s with start-up)", flush=True)
    from grpo_dist.cluster.ray_utils import shutdown_ray

    shutdown_ray()
    again = copy_bandwidth()  # a shared machine: the best of the start's and the end's
    print("copy bandwidth at the end: " + ", ".join(f"{k} {v / 1e9:.1f} GB/s" for k, v in again.items()), flush=True)
    bw = {k: max(v, again.get(k, 0.0)) for k, v in bw.items()}
    print(f"\nCPU: {cpu_line()}; copy bandwidth: " + ", ".join(f"{k} {v / 1e9:.1f} GB/s" for k, v in bw.items())
          + "\n")
    print(table(rows, bw["host"]))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"cpu": cpu_line(), "copy_bandwidth": bw, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
