"""Run untrusted Python in a separate, limited process (the code tool's sandbox).

What it does, each part only where the OS allows it without root (:func:`isolation` says which):

* a separate process (``python -I``: no user site, no ``PYTHON*`` variables), its own session,
  killed with its whole process group at the wall-clock timeout;
* limits (``resource.setrlimit`` in the child, before the code runs): CPU seconds, address space
  (memory), size of a file it writes, open files, no core dumps;
* output: stdout and stderr are read up to ``output_bytes`` together; past that the process is
  killed and the result says so (printing gigabytes costs the parent nothing);
* an empty temporary working directory (also ``HOME`` and ``TMPDIR``), deleted afterwards;
* a scrubbed environment: only ``PATH``, ``HOME``, ``TMPDIR``, ``LANG``; nothing of the parent's;
* namespaces (``unshare --map-current-user -n -p -f --mount-proc``, util-linux): no network
  (an empty network namespace: only a loopback that is down), its own PID namespace and /proc,
  so the parent's processes (and their ``/proc/<pid>/environ``) are out of sight, and everything
  it started dies with it;
* Landlock (Linux >= 5.13, unprivileged): writes, deletions and new files only inside the
  working directory (and ``/dev/null``); with Landlock ABI >= 4 also no TCP bind/connect, with
  ABI >= 6 no signals to processes outside. The child refuses to run (exit 125) if a Landlock
  that :func:`isolation` reported cannot be applied.

What it does not do: it does not hide files from reading (the code can read whatever the user
running the rollout can read: the model, the project, ``/etc``) -- only the parent's
environment and processes are out of sight, and only with namespaces; it has no seccomp filter
(any syscall the kernel allows an unprivileged process); ``RLIMIT_NPROC`` is not enforced for
root, so a fork bomb is bounded only by the CPU limit per process, the PID namespace and the
wall-clock kill; the working directory's total size is bounded per file (``file_mb``), not in
sum; UDP is cut only by the network namespace. Without ``unshare`` there is no network cut
other than Landlock's TCP rule, ``/proc/<parent>/environ`` is readable, and a process the code
starts in a new session outlives it.
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass, field
from typing import Any

from pathlib import Path

from grpo_dist.envs import _landlock
from grpo_dist.envs._landlock import landlock_abi

# the child's bootstrap: _landlock.py's own text, then its _main() (limits, Landlock, the script)
STUB = Path(_landlock.__file__).read_text(encoding="utf-8") + "\n_main()\n"


@dataclass
class SandboxLimits:
    cpu_s: int = 5
    memory_mb: int = 512
    output_bytes: int = 16384
    file_mb: int = 16
    wall_s: float = 10.0
    open_files: int = 64


@dataclass
class SandboxResult:
    stdout: str
    stderr: str
    returncode: int | None
    timed_out: bool = False
    output_truncated: bool = False
    isolation: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out and not self.output_truncated

    def text(self) -> str:
        """The tool result the model reads."""
        out = self.stdout
        if self.stderr.strip():
            out += ("\n" if out and not out.endswith("\n") else "") + self.stderr
        if self.output_truncated:
            out += "\n[output cut: more than the sandbox's output limit]"
        if self.timed_out:
            out += "\n[killed: wall-clock timeout]"
        elif self.returncode not in (0, None) and not self.output_truncated:
            out += f"\n[exit {self.returncode}{_signal_name(self.returncode)}]"
        return out.strip() or "(no output)"


def _signal_name(code: int) -> str:
    """A killed process: -N from a direct child, 128 + N through the PID namespace's init."""
    n = -code if code < 0 else code - 128 if 128 < code < 160 else 0
    try:
        return f" ({signal.Signals(n).name})" if n else ""
    except ValueError:
        return ""


@functools.lru_cache(maxsize=1)
def isolation() -> dict[str, Any]:
    """What this machine lets the sandbox apply (probed once per process)."""
    ns = False
    if shutil.which("unshare"):
        try:
            ns = subprocess.run(_UNSHARE + ["true"], capture_output=True, timeout=10).returncode == 0
        except (OSError, subprocess.SubprocessError):
            ns = False
    abi = landlock_abi()
    return {"namespaces": ns, "landlock_abi": abi,
            "network": "namespace" if ns else ("landlock-tcp" if abi >= 4 else "not cut"),
            "writes_outside_dir": "landlock" if abi >= 1 else "not blocked",
            "parent_processes": "hidden (PID namespace)" if ns else "visible"}


_UNSHARE = ["unshare", "--map-current-user", "--net", "--pid", "--fork", "--mount-proc", "--kill-child"]
_ENV_KEEP = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8"}


async def run_python(code: str, limits: SandboxLimits | None = None) -> SandboxResult:
    """Run ``code`` as a script in the sandbox and return what it printed."""
    lim = limits or SandboxLimits()
    iso = isolation()
    work = tempfile.mkdtemp(prefix="grpo-sandbox-")
    try:
        with open(os.path.join(work, "main.py"), "w", encoding="utf-8") as f:
            f.write(code)
        conf = json.dumps({**asdict(lim), "workdir": work, "landlock_abi": iso["landlock_abi"]})
        argv = (_UNSHARE if iso["namespaces"] else []) + [sys.executable, "-I", "-c", STUB, conf]
        env = {**_ENV_KEEP, "HOME": work, "TMPDIR": work}
        proc = await asyncio.create_subprocess_exec(*argv, stdin=asyncio.subprocess.DEVNULL,
                                                    stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
                                                    cwd=work, env=env, start_new_session=True)
        bufs: dict[str, bytearray] = {"out": bytearray(), "err": bytearray()}
        over = asyncio.Event()

        async def pump(stream, key):
            while True:
                chunk = await stream.read(65536)
                if not chunk:
                    return
                room = lim.output_bytes - len(bufs["out"]) - len(bufs["err"])
                bufs[key] += chunk[:max(0, room)]
                if len(chunk) > room:
                    over.set()
                    _kill(proc)
                    return

        timed_out = False
        try:
            await asyncio.wait_for(asyncio.gather(pump(proc.stdout, "out"), pump(proc.stderr, "err"), proc.wait()),
                                   lim.wall_s)
        except asyncio.TimeoutError:
            timed_out = True
        finally:
            _kill(proc)
            try:
                await asyncio.wait_for(proc.wait(), 5)
            except asyncio.TimeoutError:  # pragma: no cover - SIGKILL is not ignored
                pass
        return SandboxResult(bufs["out"].decode("utf-8", "replace"), bufs["err"].decode("utf-8", "replace"),
                             None if timed_out else proc.returncode, timed_out, over.is_set(), iso)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _kill(proc) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # its session's group: unshare and the code (PID namespace or not)
    except (ProcessLookupError, PermissionError):
        pass


def run_python_sync(code: str, limits: SandboxLimits | None = None) -> SandboxResult:
    from grpo_dist.envs.base import run

    return run(run_python(code, limits))
