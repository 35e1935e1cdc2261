"""Benchmark: one full-weight sync (``lora.enabled: false``) through each ``sync.transport``.

    python benchmarks/sync_transports.py [--models tiny,small] [--engines 2] [--reps 5]
        [--transports collective,collective:16,object_store,filesystem] [--json out.json]

Per model and transport: one run's workers are started (real local Ray cluster, DeepSpeed learner,
``--engines`` vLLM CPU engines; no training), then ``--reps`` syncs of the learner's weights are
timed by the driver (``WeightSync.push(wait=True)``: learner half and every engine's load), after
one warm-up sync. ``collective`` is learner rank 0 broadcasting buckets over a gloo group, each
engine loading them in place (``collective:16``: 16 MiB buckets instead of the default 256);
``object_store`` is the learner's tensors as one Ray object, which each engine writes to its local
tmpfs and reloads with ``reload_weights``; ``filesystem`` is the learner writing one file under
``cluster.shared_dir``, each engine reading it, writing its local copy and reloading.

Peak memory: the extra resident memory at the peak of a sync (the high-water mark, reset before
it; Linux ``/proc/self/clear_refs``) of the learner process, and of each engine's two processes
(the rollout actor, its vLLM EngineCore and worker), summed per engine, the largest engine
reported. Prints a markdown table with the machine's CPU; the same as JSON with ``--json``.

Models: ``tiny`` = the test model's shape (0.3M parameters, fp32); ``small`` = the 25M Llama of the
other benchmarks (hidden 512, 8 layers, fp32, untrained: timing only).
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

from grpo_dist.util.procenv import PROJECT_CACHE  # noqa: E402

MODELS = {"tiny": ("tiny", 64), "small": ("small", 128)}  # size, max_model_len


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


def config(model: str, transport: str, engines: int, tmp: str):
    from grpo_dist.config import load_config

    size, max_len = MODELS[model]
    name, _, bucket = transport.partition(":")
    shared = os.path.join(tmp, "shared")
    over = {
        "output_dir": os.path.join(shared, "out"),
        "model": {"path": str(PROJECT_CACHE / "bench_models" / f"{size}-untrained"),
                  "make_if_missing": {"size": size, "pretrain_task": None}, "max_model_len": max_len},
        "lora": {"enabled": False},
        "rollout": {"backend": "vllm", "num_workers": engines},
        "sync": {"transport": name, **({"bucket_mb": float(bucket)} if bucket else {})},
        "cluster": {"shared_dir": shared},
        "trainer": {"steps": 1, "eval_before_after": False, "eval_every": 0},
        "checkpoint": {"every": 0},
        "logging": {"wandb_mode": "disabled", "progress": False, "sample_table_every": 0},
    }
    return load_config(os.path.join(ROOT, "configs", "tiny_cpu.yaml"), over)


def measure(model: str, transport: str, engines: int, reps: int) -> dict:
    from grpo_dist.run.run import Run

    with tempfile.TemporaryDirectory(prefix="grpo_sync_bench_") as tmp:
        run = Run(config(model, transport, engines, tmp))
        try:
            run.start()
            version = run.sync.version  # the learner's (0: nothing is trained; each push sends its weights again)
            run.sync.push(version, wait=True)  # warm-up (first reload, first group use)
            secs, learner_peaks, engine_peaks, last = [], [], [], {}
            peaks = Peaks(run)
            for _ in range(reps):
                peaks.start()
                t0 = time.perf_counter()
                last = run.sync.push(version, wait=True)
                secs.append(time.perf_counter() - t0)
                lp, ep = peaks.stop()
                learner_peaks.append(lp)
                engine_peaks.append(ep)
            info = run.info["learner"][0]
        finally:
            run.close()
    return {"model": model, "transport": transport, "engines": engines, "params": info.get("total_params"),
            "mib": last.get("sync/bytes", 0) / 2**20, "s_per_sync": statistics.mean(secs),
            "s_min": min(secs), "learner_peak_mib": max(learner_peaks) / 2**20,
            "engine_peak_mib": max(engine_peaks) / 2**20, "buckets": last.get("sync/buckets")}


def table(rows: list[dict]) -> str:
    out = ["| model | parameters | transport | MiB sent | s/sync (mean) | s/sync (min) | learner extra peak MiB | "
           "engine extra peak MiB |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        params = f"{r['params'] / 1e6:.1f}M" if r.get("params") else "?"
        out.append(f"| {r['model']} | {params} | {r['transport']} | {r['mib']:.1f} | {r['s_per_sync']:.3f} | "
                   f"{r['s_min']:.3f} | {r['learner_peak_mib']:.1f} | {r['engine_peak_mib']:.1f} |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 2)[2],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="tiny,small")
    ap.add_argument("--transports", default="collective,collective:16,object_store,filesystem")
    ap.add_argument("--engines", type=int, default=2)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--json", default=None)
    ap.add_argument("--retries", type=int, default=2, help="runs started again after the node ran out of memory")
    args = ap.parse_args(argv)
    rows = []
    for model in args.models.split(","):
        for transport in args.transports.split(","):
            t0 = time.perf_counter()
            for attempt in range(args.retries + 1):  # a shared machine: the node may run out of memory
                try:
                    rows.append(measure(model, transport, args.engines, args.reps))
                    break
                except Exception as e:
                    if attempt == args.retries or "OutOfMemoryError" not in str(e):
                        raise
                    print(f"{model} {transport}: {str(e)[:120]}...; again in 60 s", flush=True)
                    time.sleep(60)
            print(f"{model} {transport}: {rows[-1]['s_per_sync']:.3f} s/sync ({time.perf_counter() - t0:.0f} s "
                  f"with start-up)", flush=True)
    from grpo_dist.cluster.ray_utils import shutdown_ray

    shutdown_ray()
    print(f"\n{args.engines} engines, CPU: {cpu_line()}\n")
    print(table(rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"cpu": cpu_line(), "engines": args.engines, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
