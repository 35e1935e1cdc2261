"""``grpo-dist doctor``: is this machine ready to train? One PASS/FAIL line per check:

  versions       the stack imports, with its versions
  cpu            the CPU and its vector extensions (vLLM's CPU build needs AVX2 or AVX-512 on x86)
  gpus           the GPUs torch sees (none is fine: everything runs on CPU)
  deepspeed      a learner's process group starts over gloo and all-reduces, nothing compiled
                 (DeepSpeed's C++ shm op is turned off: ``grpo_dist.learner.dist_init``)
  ray            a local Ray cluster starts and runs a task
  vllm           a vLLM engine builds on a generated tiny model and generates

The heavy checks run in child processes whose output goes to a log file (printed at the end), so
the console shows the result lines only; the exit code is 0 when every check passed, else 1.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from grpo_dist.util.cpu import cpu_flags

MARK = "@@grpo_dist_doctor@@"
STACK = ("torch", "transformers", "peft", "deepspeed", "ray", "vllm", "wandb")
X86_EXTENSIONS = ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16", "amx_tile")


@dataclass
class Result:
    name: str
    ok: bool
    detail: str
    seconds: float = 0.0

    def line(self) -> str:
        took = f" ({self.seconds:.1f} s)" if self.seconds >= 0.1 else ""
        return f"{'PASS' if self.ok else 'FAIL'}  {self.name:13s} {self.detail}{took}"


def check_versions() -> Result:
    import importlib

    found, broken = [], []
    for mod in STACK:
        try:
            found.append(f"{mod} {getattr(importlib.import_module(mod), '__version__', '?')}")
        except Exception as e:  # noqa: BLE001 - any import problem is the finding
            broken.append(f"{mod}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
    import grpo_dist

    head = f"python {platform.python_version()}, grpo_dist {getattr(grpo_dist, '__version__', '?')}, "
    if broken:
        return Result("versions", False, "not importable: " + "; ".join(broken))
    return Result("versions", True, head + ", ".join(found))


def check_cpu(cpuinfo: str | None = None) -> Result:
    model, flags = cpu_flags(cpuinfo)
    cores = os.cpu_count() or 0
    machine = platform.machine().lower()
    if machine in ("x86_64", "amd64"):
        have = [f for f in X86_EXTENSIONS if f in flags]
        ok = "avx2" in flags or "avx512f" in flags
        why = "" if ok else ": vLLM's CPU build needs AVX2 or AVX-512"
        return Result("cpu", ok, f"{model}, {cores} cores, {' '.join(have) or 'no AVX2/AVX-512'}{why}")
    simd = [f for f in ("asimd", "sve", "sve2", "bf16") if f in flags]
    return Result("cpu", True, f"{model} ({machine}), {cores} cores, {' '.join(simd) or 'extensions unknown'}")


def check_gpus() -> Result:
    import torch

    if not torch.cuda.is_available():
        return Result("gpus", True, f"none visible to torch {torch.__version__} (CPU only: rollouts on vLLM's CPU "
                                    f"build, DeepSpeed over gloo)")
    names = []
    for i in range(torch.cuda.device_count()):
        p = torch.cuda.get_device_properties(i)
        names.append(f"{i}: {p.name} {p.total_memory / 2**30:.0f} GiB")
    return Result("gpus", True, f"{len(names)} (CUDA {torch.version.cuda}): " + "; ".join(names))


def _child_deepspeed() -> Result:
    """In a child: the learner's process group (gloo, one rank), as a run's learner joins it:
    nothing compiled, nothing loaded from an extensions cache."""
    import torch

    if torch.cuda.is_available():
        return Result("deepspeed", True, "with CUDA the learners' group is NCCL's (not checked here)")
    import deepspeed
    import deepspeed.comm as dcomm
    import torch.distributed as dist

    from grpo_dist.learner.dist_init import init_process_group
    from grpo_dist.util.ports import free_port

    os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    t0 = time.perf_counter()
    init_process_group("gloo")
    took = time.perf_counter() - t0
    x = torch.ones(4)
    dcomm.all_reduce(x)
    shm = getattr(getattr(dcomm.comm, "cdb", None), "shm_comm_op", None)
    dist.destroy_process_group()
    if shm is not None:
        return Result("deepspeed", False, "DeepSpeed loaded its C++ shm op (a compiler and a build per node): "
                                          "grpo_dist.learner.dist_init could not turn it off in this version")
    return Result("deepspeed", True, f"deepspeed {deepspeed.__version__}: a gloo process group in {took:.1f} s, "
                                     f"an all-reduce, nothing compiled")


def _child_ray() -> Result:
    import ray

    from grpo_dist.cluster import local_auth

    local_auth.enable()  # token authentication, as the runs' local clusters have it
    ray.init(address="local", num_cpus=1, include_dashboard=False, log_to_driver=False)
    try:
        @ray.remote(num_cpus=0)
        def where() -> int:
            return os.getpid()

        pid = ray.get(where.remote(), timeout=120)
        return Result("ray", True, f"ray {ray.__version__}: a local cluster (token authentication) started and ran a "
                      f"task (worker pid {pid})")
    finally:
        ray.shutdown()
        local_auth.restore()


def _child_vllm(model_dir: str) -> Result:
    from grpo_dist.models import make_tiny_model
    from grpo_dist.rollout.vllm_engine import VLLMGenerator
    from grpo_dist.rollout.base import SamplingSpec

    make_tiny_model(model_dir, size="tiny", seed=0, log=None)
    t0 = time.perf_counter()
    import torch

    # as a run's rollout actor builds it: the engine core in this process on CPU (rollout.engine_in_process)
    eng = VLLMGenerator(model_dir, enable_lora=False, max_model_len=64, cpu_kvcache_gb=1,
                        in_process=not torch.cuda.is_available())
    built = time.perf_counter() - t0
    try:
        ids = eng.tokenizer("12+34=")["input_ids"]
        out = eng.generate([ids], SamplingSpec(n=2, temperature=1.0, max_tokens=4, seed=0))
        n = sum(len(s.token_ids) for s in out[0])
    finally:
        eng.close()
    if n == 0:
        return Result("vllm", False, "the engine built but generated no token")
    import vllm

    return Result("vllm", True, f"vllm {vllm.__version__}: an engine built in {built:.0f} s on a tiny model and "
                                f"generated {n} tokens")


CHILD_CHECKS: dict[str, Callable[..., Result]] = {"versions": check_versions, "deepspeed": _child_deepspeed,
                                                  "ray": _child_ray, "vllm": _child_vllm}


def _in_child(name: str, args: list, log: Path, timeout: float) -> Result:
    """Run ``CHILD_CHECKS[name](*args)`` in a fresh Python; its output is appended to ``log``."""
    t0 = time.perf_counter()
    code = (f"import json, sys; from grpo_dist.run import doctor; r = doctor.CHILD_CHECKS[{name!r}](*{args!r}); "
            f"print({MARK!r} + json.dumps(r.__dict__), flush=True)")
    with open(log, "a") as f:
        f.write(f"\n===== {name} =====\n")
        f.flush()
        try:
            r = subprocess.run([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=f, text=True,
                               timeout=timeout, env=dict(os.environ))
        except subprocess.TimeoutExpired:
            return Result(name, False, f"no result within {timeout:.0f} s (see {log})", time.perf_counter() - t0)
        f.write(r.stdout)
    for ln in reversed(r.stdout.splitlines()):
        if ln.startswith(MARK):
            res = Result(**json.loads(ln[len(MARK):]))
            res.seconds = time.perf_counter() - t0
            return res
    err = _last_error(log) or f"exit code {r.returncode}"
    return Result(name, False, f"{err} (see {log})", time.perf_counter() - t0)


def _last_error(log: Path) -> str | None:
    """The last line of the log that names an exception."""
    lines = [ln.strip() for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
    for ln in reversed(lines):
        if "Error" in ln or "Exception" in ln:
            return ln[:300]
    return None


def run(quick: bool = False, out: Callable[[str], None] = print) -> int:
    """Every check, one line each; 0 when all passed, else 1. ``quick``: no Ray or vLLM check."""
    from grpo_dist.util.procenv import setup_env

    setup_env()
    tmp = Path(tempfile.mkdtemp(prefix="grpo_dist_doctor_"))
    log = tmp / "doctor.log"
    log.touch()
    results = []
    results.append(_in_child("versions", [], log, 300))  # the imports' own warnings go to the log
    out(results[-1].line())
    for fn in (check_cpu, check_gpus):
        t0 = time.perf_counter()
        try:
            r = fn()
        except Exception as e:  # noqa: BLE001 - a check that cannot run is a failed check
            r = Result(fn.__name__.removeprefix("check_"), False, f"{type(e).__name__}: {e}")
        r.seconds = time.perf_counter() - t0
        results.append(r)
        out(r.line())
    children = [("deepspeed", [], 300)]
    if not quick:
        children += [("ray", [], 300), ("vllm", [str(tmp / "tiny-model")], 900)]
    for name, args, timeout in children:
        r = _in_child(name, args, log, timeout)
        results.append(r)
        out(r.line())
    failed = [r.name for r in results if not r.ok]
    out(f"details of the checks: {log}")
    out("all checks passed" if not failed else f"{len(failed)} check(s) failed: {', '.join(failed)}")
    return 1 if failed else 0
