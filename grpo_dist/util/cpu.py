"""What this machine's CPU is and what it computes fast (no heavy imports: the config reads it)."""

from __future__ import annotations

import functools
import platform
from pathlib import Path

# x86 flags with native bfloat16 arithmetic: AVX512_BF16 (dot products, conversions) or AMX (tiles);
# on Arm, the bf16 extension (BFDOT/BFMMLA). Without one, torch's bfloat16 matmuls on CPU convert
# through float32 and are slower than float32 itself.
BF16_FLAGS = ("avx512_bf16", "amx_bf16", "bf16")


@functools.cache
def _proc_cpuinfo() -> str:
    """This machine's /proc/cpuinfo, read once per process (every config load asks: model.dtype auto)."""
    try:
        return Path("/proc/cpuinfo").read_text()
    except OSError:
        return ""


def cpu_flags(cpuinfo: str | None = None) -> tuple[str, set[str]]:
    """(model name, flags) from ``cpuinfo`` (default this machine's /proc/cpuinfo; empty on other systems)."""
    if cpuinfo is None:
        cpuinfo = _proc_cpuinfo()
    model, flags = platform.processor() or platform.machine(), set()
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "model name" and value.strip():
            model = value.strip()
        elif key.strip() in ("flags", "Features") and not flags:
            flags = set(value.split())
    return model, flags


def bf16_native(cpuinfo: str | None = None) -> tuple[bool, str]:
    """Whether this CPU computes bfloat16 natively, and the flag (or the CPU model) that says so."""
    model, flags = cpu_flags(cpuinfo)
    have = [f for f in BF16_FLAGS if f in flags]
    return (True, f"{model} has {have[0].upper()}") if have else \
        (False, f"{model} has no AVX512_BF16, AMX or Arm BF16")
