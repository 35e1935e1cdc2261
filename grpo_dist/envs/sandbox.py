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
* namespaces (``unshare --map-current-user --keep-caps -n -p -f --mount-proc``, util-linux):
  no network (an empty network namespace: only a loopback that is down; abstract Unix sockets
  are per network namespace too), its own PID namespace and /proc,
  so the parent's processes (and their ``/proc/<pid>/environ``) are out of sight, and everything
  it started dies with it;
* a size bound on the working directory in sum (with namespaces): a private tmpfs of
  ``dir_mb`` MiB and ``dir_files`` files mounted over it in the child's own mount namespace, so
  writing past it fails with ENOSPC (``file_mb`` still bounds each file); it vanishes with the
  namespace;
* the host's socket directories hidden (with namespaces): an empty tmpfs over ``/tmp``,
  ``/var/tmp``, ``/run`` (``/var/run``), ``/dev/shm``, ``$RAY_TMPDIR`` and ``$XDG_RUNTIME_DIR``
  in the child's mount namespace, the working directory (and the Python installation, where it
  lies beneath one) bound back at its own name: Ray's raylet and object store, D-Bus,
  docker.sock are not there to connect to;
* Landlock (Linux >= 5.13, unprivileged): reads only beneath the working directory, the Python
  installation (``sys.base_prefix``), the environment's site-packages (``site_packages``, on by
  default: models' code imports numpy or sympy), the system's library directories, a few files
  (``/etc/ld.so.cache``, ``/etc/localtime``, ``/dev/null``, ``/dev/urandom``...) and
  ``/proc/self``: the user's home, the project, ``/tmp`` and other users' files are unreadable
  (their names can still be ``stat``-ed: Landlock does not cover metadata); writes, deletions
  and new files only inside the working directory (and ``/dev/null``); programs run only from
  the Python installation and the library directories; with Landlock ABI >= 4 also no TCP
  bind/connect, with ABI >= 6 no signals to processes outside;
* a seccomp filter (x86-64 and arm64, where the kernel has seccomp filters): no ptrace or other
  processes' memory, no mount or new namespaces, no bpf, perf_event_open, io_uring, keyrings,
  kexec or modules, no socket() of any family (AF_UNIX included), connect() or bind(): only a
  connected Unix stream pair from socketpair() (grpo_dist/envs/_seccomp.py lists it all, and
  what it leaves unfiltered). Without seccomp the sandbox refuses to run code (exit 125) unless
  ``allow_unix_sockets`` is set: nothing else stops a connect() to a pathname Unix socket.

The child refuses to run (exit 125) if a wall that :func:`isolation` reported (tmpfs, Landlock,
seccomp) cannot be applied: it fails closed. Where the kernel lacks one, :func:`isolation` says
so and the code runs without it.

What it does not do: without Landlock it does not hide files from reading; ``RLIMIT_NPROC`` is
not enforced for root, so a fork bomb is bounded only by the CPU limit per process, the PID
namespace and the wall-clock kill; in its user namespace the code keeps the capabilities that
namespace grants (the mount is made with them; the filter and Landlock then forbid mounts and
new namespaces); UDP is cut by the network namespace and the filter's socket rule. Without
``unshare`` there is no network cut other than Landlock's TCP rule and the filter,
``/proc/<parent>/environ`` is readable unless Landlock hides it, the directory's size is bounded
only per file, and a process the code starts in a new session outlives it.
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
import sysconfig
import tempfile
from dataclasses import asdict, dataclass, field
from typing import Any

from pathlib import Path

from grpo_dist.envs import _landlock, _seccomp
from grpo_dist.envs._landlock import landlock_abi
from grpo_dist.envs._seccomp import seccomp_supported

# the child's bootstrap: _seccomp.py's and _landlock.py's own text, then the latter's _main()
# (tmpfs, limits, Landlock, the filter, the script)
STUB = "\n".join(Path(m.__file__).read_text(encoding="utf-8") for m in (_seccomp, _landlock)) + "\n_main()\n"


@dataclass
class SandboxLimits:
    cpu_s: int = 5
    memory_mb: int = 512
    output_bytes: int = 16384
    file_mb: int = 16
    dir_mb: int = 64
    dir_files: int = 4096
    site_packages: bool = True
    wall_s: float = 10.0
    open_files: int = 64
    # run even where no wall keeps the code from Unix sockets outside (a kernel without seccomp)
    allow_unix_sockets: bool = False


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
    ns = tmpfs = False
    if shutil.which("unshare"):
        probe = tempfile.mkdtemp(prefix="grpo-sandbox-probe-")
        try:  # 0: namespaces and a tmpfs mount in them; 3: namespaces only
            rc = subprocess.run(_UNSHARE + [sys.executable, "-I", "-c", _TMPFS_PROBE, probe], capture_output=True,
                                timeout=30).returncode
            ns, tmpfs = rc in (0, 3), rc == 0
        except (OSError, subprocess.SubprocessError):
            pass
        finally:
            os.rmdir(probe)
    abi = landlock_abi()
    sc = seccomp_supported()
    return {"namespaces": ns, "landlock_abi": abi, "seccomp": sc, "dir_tmpfs": tmpfs,
            "network": "namespace" if ns else ("landlock-tcp" if abi >= 4 else "not cut"),
            "writes_outside_dir": "landlock" if abi >= 1 else "not blocked",
            "reads_outside_dir": "landlock" if abi >= 1 else "not blocked",
            "dir_size": "tmpfs" if tmpfs else "per file",
            "syscalls": "seccomp" if sc else "not filtered",
            "unix_sockets": "seccomp" if sc else "not cut",
            "socket_dirs": "hidden (mount namespace)" if tmpfs else "visible",
            "parent_processes": "hidden (PID namespace)" if ns else "visible"}


# where sockets listen on a Linux host: Ray's session (/tmp/ray), X11, D-Bus and systemd (/run),
# docker.sock (/run, /var/run), POSIX shared memory; the child sees empty directories instead
SOCKET_DIRS = ("/tmp", "/var/tmp", "/run", "/var/run", "/dev/shm")


def socket_dirs() -> list[str]:
    """The directories to hide from the child (:data:`SOCKET_DIRS`, Ray's temp dir and the user's
    runtime dir where set elsewhere), each real path once, none beneath another."""
    names = list(SOCKET_DIRS) + [os.environ[v] for v in ("RAY_TMPDIR", "XDG_RUNTIME_DIR") if os.environ.get(v)]
    real = sorted({os.path.realpath(d) for d in names if os.path.isdir(d)} - {"/"})
    return [d for d in real if not any(d.startswith(o.rstrip("/") + "/") for o in real if o != d)]


# --keep-caps: the child keeps the namespace's capabilities across exec (a non-root user needs them to mount)
_UNSHARE = ["unshare", "--map-current-user", "--keep-caps", "--net", "--pid", "--fork", "--mount-proc",
            "--kill-child"]
_TMPFS_PROBE = ("import ctypes, sys\n"
                "sys.exit(0 if ctypes.CDLL(None).mount(b'tmpfs', sys.argv[1].encode(), b'tmpfs', 14, b'size=1m') == 0"
                " else 3)")


def _read_paths(site_packages: bool) -> tuple[list[str], list[str]]:
    """What the child may read of Python: its installation, and the environment's site-packages."""
    dirs = {sys.base_prefix, sys.base_exec_prefix} - {"/"}
    if not dirs:  # an interpreter installed at /: its library directories and its executable's
        dirs = {sysconfig.get_paths()["stdlib"], sysconfig.get_paths()["platstdlib"],
                os.path.dirname(os.path.realpath(sys.executable))}
    files = []
    if site_packages:
        dirs |= {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
        files.append(os.path.join(sys.prefix, "pyvenv.cfg"))
    return sorted(d for d in dirs if os.path.isdir(d)), [f for f in files if os.path.isfile(f)]
_ENV_KEEP = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8"}


async def run_python(code: str, limits: SandboxLimits | None = None) -> SandboxResult:
    """Run ``code`` as a script in the sandbox and return what it printed."""
    lim = limits or SandboxLimits()
    iso = isolation()
    if iso["unix_sockets"] == "not cut" and not lim.allow_unix_sockets:  # fail closed
        return SandboxResult("", "sandbox: this kernel cannot filter system calls (seccomp), so code could reach "
                             "Unix sockets outside the sandbox (Ray's raylet, D-Bus); not running it. Set "
                             "SandboxLimits(allow_unix_sockets=True) to run it anyway.", 125, isolation=iso)
    work = tempfile.mkdtemp(prefix="grpo-sandbox-")
    try:
        with open(os.path.join(work, "main.py"), "w", encoding="utf-8") as f:
            f.write(code)
        read_dirs, read_files = _read_paths(lim.site_packages)
        conf = json.dumps({**asdict(lim), "workdir": work, "landlock_abi": iso["landlock_abi"],
                           "seccomp": iso["seccomp"], "dir_tmpfs": iso["dir_tmpfs"],
                           "hide_dirs": socket_dirs() if iso["dir_tmpfs"] else [],
                           "keep": [os.path.dirname(os.path.abspath(sys.executable))],
                           "read_dirs": read_dirs, "read_files": read_files})
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

