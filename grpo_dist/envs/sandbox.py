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
  ``/var/tmp``, ``/run`` (``/var/run``), ``/dev/shm``, the parent's temporary directory
  (``TMPDIR``: a local cluster's session lives there), the live Ray session's directories,
  ``$RAY_TMPDIR`` and ``$XDG_RUNTIME_DIR`` in the child's mount namespace, the working directory
  (and the Python installation, where it lies beneath one) bound back at its own name: Ray's
  raylet and object store, D-Bus, docker.sock are not there to connect to;
* no capabilities: the mounts made, the child drops every capability (bounding set included,
  no_new_privs), so in its user namespace it cannot unmount or remount; the namespaces' PID 1
  makes the mounts, is not dumpable (its children cannot open ``/proc/1/mem``) and carries
  Landlock and the filter too before the code, its child, starts;
* Landlock (Linux >= 5.13, unprivileged): reads only beneath the working directory, the Python
  installation (``sys.base_prefix``), the environment's site-packages (``site_packages``, on by
  default: models' code imports numpy or sympy), the system's library directories, a few files
  (``/etc/ld.so.cache``, ``/etc/localtime``, ``/dev/null``, ``/dev/urandom``...) and
  ``/proc/self``: the user's home, the project, ``/tmp`` and other users' files are unreadable
  (their names can still be ``stat``-ed: Landlock does not cover metadata); writes, deletions
  and new files only inside the working directory (and ``/dev/null``); programs run only from
  the Python installation and the library directories; with Landlock ABI >= 4 also no TCP
  bind/connect, with ABI >= 6 no signals to processes outside; processes outside cannot be
  ptraced (nor their ``/proc/<pid>/mem`` opened) at any ABI;
* a seccomp filter (x86-64 and arm64, where the kernel has seccomp filters): no ptrace or other
  processes' memory, no mount or new namespaces, no bpf, perf_event_open, io_uring, keyrings,
  kexec or modules, no socket() of any family (AF_UNIX included), connect() or bind(): only a
  connected Unix stream pair from socketpair(); without a PID namespace also nothing that acts
  on another process (prlimit, setpriority, sched_setaffinity...; setsid, setpgid; kill(-1)) and,
  below Landlock ABI 6, no signal to another (grpo_dist/envs/_seccomp.py lists it all, and what
  it leaves unfiltered).

Each attack is stopped by one wall at least, or the sandbox refuses to run code (exit 125, one
line naming the missing walls and the :class:`SandboxLimits` field that accepts the exposure:
:func:`refusal`; docs/security.md has the table). The child refuses to run (exit 125) if a wall
that :func:`isolation` reported (tmpfs, capabilities, Landlock, seccomp) cannot be applied: it
fails closed.

What it does not do: ``RLIMIT_NPROC`` is not enforced for root, so a fork bomb is bounded only by
the CPU limit per process, the PID namespace and the wall-clock kill. Without ``unshare`` the
directory's size is bounded only per file (``file_mb``; the CPU and wall-clock limits bound how
much it writes), the code cannot signal its own children (below Landlock ABI 6: the filter
cannot tell them from other processes) nor start a new session, and the abstract Unix socket
namespace is shared (the filter's socket rule is what cuts it).
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
    # run even where a wall is missing and nothing covers it (docs/security.md "The code tool's
    # sandbox"); without them the sandbox refuses, in one line naming the wall and the field:
    allow_unix_sockets: bool = False  # no seccomp: Unix sockets outside (Ray's raylet, D-Bus)
    allow_network: bool = False  # neither a network namespace nor seccomp
    # no PID namespace, and no Landlock (other processes' /proc/<pid>/environ and memory) or no
    # seccomp (their limits and priorities; their signals too below Landlock ABI 6)
    allow_host_processes: bool = False
    allow_host_files: bool = False  # no Landlock: this user's files outside the directory


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


# for tests: walls to leave off, comma-separated ("namespaces", "landlock", "landlock-scope": Landlock
# at most ABI 5, "seccomp"), to try each attack against the walls that remain (tests/test_sandbox_walls.py)
WITHOUT_VAR = "GRPO_DIST_SANDBOX_TEST_WITHOUT"
_WALLS_OFF = ("namespaces", "landlock", "landlock-scope", "seccomp")


def isolation() -> dict[str, Any]:
    """What this machine lets the sandbox apply (probed once per process), less the walls
    :data:`WITHOUT_VAR` turns off; what stops each attack."""
    walls = dict(_probe())
    off = [w.strip() for w in os.environ.get(WITHOUT_VAR, "").split(",") if w.strip()]
    for w in off:
        if w not in _WALLS_OFF:
            raise ValueError(f"{WITHOUT_VAR}: unknown wall {w!r} (known: {', '.join(_WALLS_OFF)})")
    if "namespaces" in off:
        walls.update(namespaces=False, dir_tmpfs=False)
    if "landlock" in off or "landlock-scope" in off:
        walls["landlock_abi"] = 0 if "landlock" in off else min(walls["landlock_abi"], 5)
    if "seccomp" in off:
        walls["seccomp"] = False
    ns, abi, sc, tmpfs = walls["namespaces"], walls["landlock_abi"], walls["seccomp"], walls["dir_tmpfs"]
    return {**walls,
            "network": "namespace" if ns else "seccomp" if sc else ("landlock-tcp" if abi >= 4 else "not cut"),
            "writes_outside_dir": "landlock" if abi >= 1 else "not blocked",
            "reads_outside_dir": "landlock" if abi >= 1 else "not blocked",
            "dir_size": "tmpfs" if tmpfs else "per file",
            "syscalls": "seccomp" if sc else "not filtered",
            "unix_sockets": "seccomp" if sc else "not cut",
            "socket_dirs": "hidden (mount namespace)" if tmpfs else "visible",
            "parent_processes": "hidden (PID namespace)" if ns else "landlock" if abi >= 1 else "visible",
            "signals_outside": "PID namespace" if ns else "landlock" if abi >= 6 else "seccomp" if sc else "not cut",
            "capabilities": "dropped"}


@functools.lru_cache(maxsize=1)
def _probe() -> dict[str, Any]:
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
    return {"namespaces": ns, "landlock_abi": landlock_abi(), "seccomp": seccomp_supported(), "dir_tmpfs": tmpfs}


def refusal(iso: dict[str, Any], lim: SandboxLimits) -> str | None:
    """Why the sandbox will not run code here: the first attack that no wall of ``iso`` stops and
    whose override ``lim`` leaves off (one line), or None. Each attack with the walls that stop it
    (any one suffices): docs/security.md."""
    ns, abi, sc = iso["namespaces"], iso["landlock_abi"], iso["seccomp"]
    older = "Landlock older than ABI 6" if abi else "no Landlock"
    gaps = [  # (covered, the walls missing, what the code could do, the override)
        (sc, "no seccomp", "code could reach Unix sockets outside the sandbox (Ray's raylet, D-Bus)",
         "allow_unix_sockets"),
        (ns or sc, "no network namespace and no seccomp", "code could use the network", "allow_network"),
        (ns or abi >= 6 or sc, f"no PID namespace, {older} and no seccomp",
         "code could signal every process of this user (os.kill(-1, 9) ends the driver, Ray and every actor)",
         "allow_host_processes"),
        (ns or sc, "no PID namespace and no seccomp", "code could change other processes' limits and priorities "
         "(prlimit, setpriority) and leave processes running", "allow_host_processes"),
        (ns or abi >= 1, "no PID namespace and no Landlock", "code could read other processes' environment and "
         "memory (/proc/<pid>/environ: the W&B key, the Ray token)", "allow_host_processes"),
        (abi >= 1, "no Landlock", "code could read and write this user's files outside its directory (~/.netrc, "
         "tokens, the project)", "allow_host_files"),
    ]
    for covered, missing, what, override in gaps:
        if not covered and not getattr(lim, override):
            return (f"sandbox: {missing} on this machine, so {what}; not running it. Set "
                    f"SandboxLimits({override}=True) to run it anyway.")
    return None


# where sockets listen on a Linux host: Ray's session (/tmp/ray), X11, D-Bus and systemd (/run),
# docker.sock (/run, /var/run), POSIX shared memory; the child sees empty directories instead
SOCKET_DIRS = ("/tmp", "/var/tmp", "/run", "/var/run", "/dev/shm")


def socket_dirs() -> list[str]:
    """The directories to hide from the child (:data:`SOCKET_DIRS`; this process's temporary
    directory, where a local cluster's session lives: ``local_auth.private_temp_dir``; the live
    Ray session's directories; ``$RAY_TMPDIR`` and the user's runtime dir), each real path once,
    none beneath another."""
    names = list(SOCKET_DIRS) + [tempfile.gettempdir()] + _ray_session_dirs()
    names += [os.environ[v] for v in ("RAY_TMPDIR", "XDG_RUNTIME_DIR") if os.environ.get(v)]
    real = sorted({os.path.realpath(d) for d in names if os.path.isdir(d)} - {"/"})
    return [d for d in real if not any(d.startswith(o.rstrip("/") + "/") for o in real if o != d)]


def _ray_session_dirs() -> list[str]:
    """Where the Ray session this process is connected to keeps its sockets, wherever it was
    started (``ray start --temp-dir``, another ``TMPDIR``); none unless Ray is imported and connected."""
    worker = sys.modules.get("ray._private.worker")
    node = getattr(getattr(worker, "global_worker", None), "node", None)
    if node is None:
        return []
    return [node.get_temp_dir_path(), node.get_sockets_dir_path(), os.path.dirname(node.raylet_socket_name),
            os.path.dirname(node.plasma_store_socket_name)]


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
    why = refusal(iso, lim)
    if why:  # fail closed
        return SandboxResult("", why, 125, isolation=iso)
    ns, tmpfs = iso["namespaces"], iso["namespaces"] and iso["dir_tmpfs"]  # mounts only in its own namespace
    work = tempfile.mkdtemp(prefix="grpo-sandbox-")
    try:
        with open(os.path.join(work, "main.py"), "w", encoding="utf-8") as f:
            f.write(code)
        read_dirs, read_files = _read_paths(lim.site_packages)
        # without a PID namespace the filter keeps the code off other processes (signals too below
        # Landlock ABI 6, whose scope covers them otherwise)
        rules = None if ns or not iso["seccomp"] else "signals" if iso["landlock_abi"] < 6 else "limits"
        conf = json.dumps({**asdict(lim), "workdir": work, "landlock_abi": iso["landlock_abi"],
                           "seccomp": iso["seccomp"], "process_rules": rules, "dir_tmpfs": tmpfs,
                           "hide_dirs": socket_dirs() if tmpfs else [],
                           "keep": [os.path.dirname(os.path.abspath(sys.executable))],
                           "read_dirs": read_dirs, "read_files": read_files})
        argv = (_UNSHARE if ns else []) + [sys.executable, "-I", "-c", STUB, conf]
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

