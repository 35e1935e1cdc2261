"""What a GPU lease's rows measured: each target beside its figure, a killed row's finished steps, a
log's tail without Ray's stack dumps (``benchmarks/gpu_lease.py`` writes them into ``lease.json``).
Standard library only: it runs on the GPU machine before anything is installed."""

from __future__ import annotations

import glob
import json
import os
import re
import sys
from typing import Any, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

from gpu_e2e import row_of  # noqa: E402  (standard library only, like this file)

# (target, how it is read from the rows, the bound, "max" = the figure must not exceed it)
TARGETS = [
    ("lora_generate_vs_full", "generate of lora / generate of disagg, same model (qwen2-0.5b, else smollm2)", 1.2,
     "max"),
    ("colocated_sync_s", "sync of colocated (qwen2-0.5b)", 0.5, "max"),
    ("learner_mfu_lora", "mfu of lora (qwen2-0.5b, packed, no checkpointing)", 0.20, "min"),
    ("warm_startup_s", "startup of the warm rerun (qwen2-0.5b lora)", 40.0, "max"),
    ("vs_trl_steps_per_s", "grpo_dist colocated / TRL colocated, steps per second, same workload (smollm2)", 1.5,
     "min"),
]


NOISE = re.compile(r"logging\.cc:|^\s+@ |SIGTERM received|Capturing CUDA graphs|^\s*$")  # Ray's stack dumps on a kill


def tail(path: str, n: int) -> str:
    """The last ``n`` characters of the log's lines that say something (a killed row's Ray processes
    print a stack dump each: 7 KB of them hid why the row was slow)."""
    with open(path, encoding="utf-8", errors="replace") as f:
        lines = [ln for ln in f.read().splitlines() if not NOISE.search(ln)]
    return "\n".join(lines)[-n:]


# what vLLM and the run say about their start-up, kept from each row's logs
STARTUP_LINE = re.compile(r"actors ready in|took [0-9.]+ ?s|takes [0-9.]+ ?s|finished in [0-9.]+ ?s|"
                          r"[0-9.]+ seconds|compil", re.IGNORECASE)


def partial_of(run_dir: str) -> dict[str, Any]:
    """The steps a row finished before it was killed (its table is written only at the end: gpu_e2e's
    columns over the steps after the first, as its table would have them), and its start-up lines."""
    out: dict[str, Any] = {}
    for metrics in glob.glob(os.path.join(run_dir, "*", "metrics.jsonl")):
        with open(metrics) as f:
            steps = [json.loads(ln) for ln in f if ln.strip()]
        out["steps"] = len(steps)
        out["means"] = {c: v for c, v in row_of(steps, skip=1, sleeps=False).items()
                        if isinstance(v, float)}
    lines = []
    for log in glob.glob(os.path.join(run_dir, "*", "workers.log")):
        with open(log, encoding="utf-8", errors="replace") as f:
            lines += [ln.strip()[:300] for ln in f if STARTUP_LINE.search(ln) and not NOISE.search(ln)]
    if lines:
        out["startup_lines"] = lines[-40:]
    return out


def _rows_of(rec: dict[str, Any]) -> list[dict[str, Any]]:
    return list((rec.get("table") or {}).get("rows") or [])


def _find(records: list[dict[str, Any]], name: str, model: str, setting: str) -> Optional[dict[str, Any]]:
    """The row's table entry; for a row killed after 2 or more steps, the means of its steps (``partial``)."""
    for rec in records:
        if rec["name"] == name:
            done = next((r for r in _rows_of(rec) if r["model"] == model and r["setting"] == setting and r["rc"] == 0),
                        None)
            if done is None and rec.get("steps", 0) >= 2:
                return {**rec["means"], "partial": True}
            return done
    return None


def targets(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each target beside its figure (None where no row measured it; ``partial``: from a killed row's steps)."""
    partial: set[str] = set()

    def col(rec_name, model, setting, c):
        r = _find(records, rec_name, model, setting)
        if r is not None and r.get("partial") and r.get(c) is not None:
            partial.add(rec_name)
        return None if r is None else r.get(c)

    ratio = None
    for model, full_row, lora_row in (("qwen2-0.5b", "disagg_qwen2", "lora_packed_qwen2"),
                                      ("smollm2", "full_smollm2", "lora_smollm2")):
        full, lora = col(full_row, model, "disagg", "generate"), col(lora_row, model, "lora", "generate")
        if full and lora:
            ratio = lora / full
            break
    trl = next((rec.get("table", {}).get("trl") for rec in records if rec["name"] == "trl_smollm2"), None) or {}
    mfu_rows = ("lora_packed_qwen2", "mfu_long_qwen2", "warm_long_qwen2")  # any LoRA row's MFU, the best
    warm_rows = ("warm_start_qwen2", "warm_long_qwen2")  # a LoRA row run again with vLLM's caches kept
    used = {"lora_generate_vs_full": {"disagg_qwen2", "lora_packed_qwen2", "full_smollm2", "lora_smollm2"},
            "colocated_sync_s": {"colocated_qwen2"}, "learner_mfu_lora": set(mfu_rows),
            "warm_startup_s": set(warm_rows), "vs_trl_steps_per_s": set()}
    mfus = [v for v in (col(n, "qwen2-0.5b", "lora", "mfu") for n in mfu_rows) if v is not None]
    warm = [v for v in (col(n, "qwen2-0.5b", "lora", "startup") for n in warm_rows) if v is not None]
    figures = {
        "lora_generate_vs_full": ratio,
        "colocated_sync_s": col("colocated_qwen2", "qwen2-0.5b", "colocated", "sync"),
        "learner_mfu_lora": max(mfus) if mfus else None,
        "warm_startup_s": min(warm) if warm else None,
        "vs_trl_steps_per_s": trl.get("ratio") if isinstance(trl, dict) else None,
    }
    out = []
    for name, how, bound, kind in TARGETS:
        v = figures[name]
        met = None if v is None else (v <= bound if kind == "max" else v >= bound)
        out.append({"target": name, "how": how, "bound": bound, "kind": kind, "figure": v, "met": met,
                    "partial": sorted(used[name] & partial) if v is not None else []})
    return out
