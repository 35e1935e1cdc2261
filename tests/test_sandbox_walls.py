"""The code tool's sandbox where walls are missing (issue 52): each degraded mode is forced
(``GRPO_DIST_SANDBOX_TEST_WITHOUT``) and the attacks are tried in it: ``kill(-1)``, a kill of the
parent, of a sibling, through every other system call that signals or changes another process
(tgkill, rt_sigqueueinfo, pidfd_send_signal, F_SETOWN, prlimit, setpriority, sched_setaffinity,
setsid), reading the parent's ``/proc/<pid>/environ``, and taking over the sandbox's PID 1 through
``/proc/1/mem``. A wall that nothing covers makes the sandbox refuse, naming it and the override.

Safety: the attacks run against a throwaway driver (the parent of the sandbox, which holds a
secret in its environment) and a sibling victim, both inside a PID namespace of their own where
``unshare`` allows one (as the sandbox's own: a kill(-1) that got through would end only them).
The deadly signals (SIGKILL to the victim, the parent and -1) are sent only there, and only once
signal 0 or SIGCONT to the same targets was refused; elsewhere only those probes run."""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import sys

import pytest

from grpo_dist.envs import sandbox
from grpo_dist.envs.base import run
from grpo_dist.envs.sandbox import WITHOUT_VAR, SandboxLimits, isolation, run_python

SECRET = "hunter2-walls"
REAL = isolation()
_OUTER = ["unshare", "--map-current-user", "--pid", "--fork", "--mount-proc", "--kill-child"]
# PID 1 of the outer namespace (an init ignores signals from its own namespace: the driver must not be one)
_INIT = "import subprocess, sys; sys.exit(subprocess.call(sys.argv[1:]))"


def _outer_ns() -> bool:
    try:
        return shutil.which("unshare") is not None and subprocess.run(
            _OUTER + ["true"], capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


OUTER = _outer_ns()

DRIVER = """
import asyncio, json, subprocess, sys, time
from grpo_dist.envs.sandbox import SandboxLimits, run_python
victim = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
code = sys.stdin.read().replace("VICTIM_PID", str(victim.pid))
r = asyncio.run(run_python(code, SandboxLimits(wall_s=60, **json.loads(sys.argv[1]))))
time.sleep(0.2)
alive = victim.poll() is None
victim.kill()
victim.wait()
print(json.dumps({"rc": r.returncode, "out": r.stdout, "err": r.stderr, "victim_alive": alive, "iso": r.isolation}))
"""

_COL = 0 if platform.machine().lower() in ("x86_64", "amd64") else 1
_NR = {k: v[_COL] for k, v in {"tgkill": (234, 131), "rt_sigqueueinfo": (129, 138),
                                 "pidfd_send_signal": (424, 424)}.items()}

ATTACK = """
import ctypes, fcntl, json, os, resource, signal, subprocess, sys, time
libc = ctypes.CDLL(None, use_errno=True)
victim, parent, NR = VICTIM_PID, os.getppid(), NRS
out = {}

def probe(name, fn):
    try:
        r = fn()
        out[name] = r if isinstance(r, str) else "done"
    except OSError as e:
        out[name] = type(e).__name__

def call(*args):
    if libc.syscall(*args) < 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))

def in_child(fn):  # fn in a forked child: its exit code is the errno
    pid = os.fork()
    if pid == 0:
        try:
            fn()
            os._exit(0)
        except OSError as e:
            os._exit(e.errno)
    code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    if code:
        raise OSError(code, os.strerror(code))

def environ(pid):
    return "leaked" if SECRET.encode() in open("/proc/%d/environ" % pid, "rb").read() else "no secret"

def own_child():  # (left running where the kill is refused: the sandbox's end kills it)
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL)
    p.kill()
    p.wait()

def take_over_pid_1():  # rewrite a byte of PID 1's writable memory with itself
    start = next(int(ln.split("-")[0], 16) for ln in open("/proc/1/maps") if ln.split()[1].startswith("rw"))
    with open("/proc/1/mem", "r+b", buffering=0) as f:
        f.seek(start)
        b = f.read(1)
        f.seek(start)
        f.write(b)

def status(pid):
    keep = ("CapEff", "Seccomp", "NoNewPrivs")
    return " ".join(ln.split()[1] for ln in open("/proc/%d/status" % pid) if ln.split(":")[0] in keep)

info = ctypes.create_string_buffer(128)
info[8:12] = (-1).to_bytes(4, "little", signed=True)  # si_code SI_QUEUE
outside = {
    "kill -1": lambda: os.kill(-1, 0),
    "kill parent": lambda: os.kill(parent, 0),
    "kill victim": lambda: os.kill(victim, signal.SIGCONT),
    "killpg victim": lambda: os.killpg(victim, 0),
    "tgkill victim": lambda: call(NR["tgkill"], victim, victim, 0),
    "sigqueue victim": lambda: call(NR["rt_sigqueueinfo"], victim, 0, info),
    "pidfd victim": lambda: call(NR["pidfd_send_signal"], os.pidfd_open(victim), 0, None, 0),
    "F_SETOWN victim": lambda: fcntl.fcntl(os.pipe()[0], fcntl.F_SETOWN, victim),
    "prlimit victim": lambda: resource.prlimit(victim, resource.RLIMIT_CORE),
    "setpriority victim": lambda: os.setpriority(os.PRIO_PROCESS, victim, os.getpriority(os.PRIO_PROCESS, victim)),
    "setaffinity victim": lambda: os.sched_setaffinity(victim, os.sched_getaffinity(victim)),
    "setsid": lambda: in_child(os.setsid),
}
for name, fn in outside.items():
    probe(name, fn)
probe("environ parent", lambda: environ(parent))
probe("mem parent", lambda: open("/proc/%d/mem" % parent, "r+b").close())
if TAKEOVER:
    probe("mem 1", take_over_pid_1)
    probe("pid 1", lambda: status(1))
probe("caps", lambda: status(os.getpid()).split()[0])
signal.signal(signal.SIGUSR1, lambda *a: None)
for name, fn in {"kill self": lambda: os.kill(os.getpid(), 0), "kill group": lambda: os.kill(0, 0),
                 "raise": lambda: signal.raise_signal(signal.SIGUSR1), "nice": lambda: os.nice(1),
                 "setrlimit": lambda: resource.setrlimit(resource.RLIMIT_CORE, (0, 0)),
                 "own child": own_child}.items():
    probe(name, fn)
if ESCALATE and REFUSED and all(out[k] in ("PermissionError", "ProcessLookupError") for k in REFUSED):
    for name, pid in (("SIGKILL victim", victim), ("SIGKILL parent", parent), ("SIGKILL -1", -1)):
        probe(name, lambda: os.kill(pid, signal.SIGKILL))
    time.sleep(0.5)
print(json.dumps(out))
"""

SIGNALS = ["kill -1", "kill parent", "kill victim", "killpg victim", "tgkill victim", "sigqueue victim",
           "pidfd victim", "F_SETOWN victim"]
LIMITS = ["prlimit victim", "setpriority victim", "setaffinity victim", "setsid"]
OWN = ["kill self", "kill group", "raise", "nice", "setrlimit"]


def attack(without: str, refused: list[str], takeover: bool = False, **limits) -> dict:
    """ATTACK run by a throwaway driver in the walls ``without`` leaves; the driver's report."""
    code = (ATTACK.replace("NRS", repr(_NR)).replace("SECRET", repr(SECRET)).replace("TAKEOVER", str(takeover))
            .replace("ESCALATE", str(OUTER)).replace("REFUSED", repr(refused)))
    argv = [sys.executable, "-c", DRIVER, json.dumps(limits)]
    if OUTER:
        argv = _OUTER + [sys.executable, "-c", _INIT] + argv
    env = {**os.environ, WITHOUT_VAR: without, "GRPO_TEST_WALLS_SECRET": SECRET}
    p = subprocess.run(argv, input=code, capture_output=True, text=True, timeout=180, env=env, start_new_session=True)
    assert p.returncode == 0 and p.stdout.strip(), f"the driver did not survive (rc {p.returncode}): {p.stderr[-2000:]}"
    rep = json.loads(p.stdout.splitlines()[-1])
    assert rep["victim_alive"], rep
    return rep


def _result(rep: dict) -> dict:
    assert rep["rc"] == 0, rep
    return json.loads(rep["out"].splitlines()[-1])


needs_seccomp = pytest.mark.skipif(not REAL["seccomp"], reason="no seccomp filters on this kernel or architecture")
needs_landlock = pytest.mark.skipif(REAL["landlock_abi"] < 1, reason="no Landlock on this kernel")
needs_ns = pytest.mark.skipif(not REAL["namespaces"], reason="no unshare here")


@needs_seccomp
@needs_landlock
def test_without_a_pid_namespace_or_landlocks_scope_the_filter_stops_signals_outside():
    rep = attack("namespaces,landlock-scope", SIGNALS + LIMITS)
    assert not rep["iso"]["namespaces"] and rep["iso"]["landlock_abi"] == min(REAL["landlock_abi"], 5)
    out = _result(rep)
    assert {k: out[k] for k in SIGNALS + LIMITS} == dict.fromkeys(SIGNALS + LIMITS, "PermissionError"), out
    assert out["environ parent"] == out["mem parent"] == "PermissionError", out  # Landlock
    assert out["caps"] == "0000000000000000" and {k: out[k] for k in OWN} == dict.fromkeys(OWN, "done"), out
    assert out["own child"] == "PermissionError", out  # the price of this mode (docs/security.md)
    if OUTER:  # the deadly signals themselves, once the probes were refused
        assert [out[k] for k in ("SIGKILL victim", "SIGKILL parent", "SIGKILL -1")] == ["PermissionError"] * 3, out


@needs_seccomp
@pytest.mark.skipif(REAL["landlock_abi"] < 6, reason="Landlock older than ABI 6 here: no signal scope")
def test_without_a_pid_namespace_landlocks_scope_stops_signals_and_the_filter_the_rest():
    signals = [k for k in SIGNALS if k != "F_SETOWN victim"]  # Landlock refuses the SIGIO itself, not the owner
    rep = attack("namespaces", signals + LIMITS)
    assert not rep["iso"]["namespaces"] and rep["iso"]["landlock_abi"] >= 6
    out = _result(rep)
    assert {k: out[k] for k in signals + LIMITS} == dict.fromkeys(signals + LIMITS, "PermissionError"), out
    assert out["environ parent"] == out["mem parent"] == "PermissionError", out
    assert out["caps"] == "0000000000000000" and {k: out[k] for k in OWN + ["own child"]} == dict.fromkeys(
        OWN + ["own child"], "done"), out  # its own children it may signal: they share its Landlock domain
    if OUTER:
        assert [out[k] for k in ("SIGKILL victim", "SIGKILL parent", "SIGKILL -1")] == ["PermissionError"] * 3, out


@needs_seccomp
def test_without_a_pid_namespace_or_landlock_the_sandbox_refuses_to_run():
    rep = attack("namespaces,landlock", [])
    assert rep["rc"] == 125 and rep["out"] == "" and len(rep["err"].splitlines()) == 1, rep
    assert "no PID namespace and no Landlock" in rep["err"] and "allow_host_processes=True" in rep["err"], rep
    rep = attack("namespaces,landlock", [], allow_host_processes=True)
    assert rep["rc"] == 125 and "no Landlock" in rep["err"] and "allow_host_files=True" in rep["err"], rep
    # both exposures accepted: the filter alone still stops every signal and change to another process
    out = _result(attack("namespaces,landlock", SIGNALS + LIMITS, allow_host_processes=True, allow_host_files=True))
    assert {k: out[k] for k in SIGNALS + LIMITS} == dict.fromkeys(SIGNALS + LIMITS, "PermissionError"), out


@needs_ns
@needs_seccomp
def test_without_landlock_pid_1_of_the_sandbox_cannot_be_taken_over():
    """Its PID 1 is not dumpable and carries the filter; the code holds no capability, so it can
    neither open /proc/1/mem nor unmount what hides the host's sockets."""
    rep = attack("landlock", [], takeover=True, allow_host_files=True)
    assert rep["iso"]["namespaces"] and rep["iso"]["landlock_abi"] == 0
    out = _result(rep)
    assert out["mem 1"] == "PermissionError", out
    assert out["pid 1"] == "0000000000000000 1 2", out  # CapEff, NoNewPrivs, Seccomp (filter mode)
    assert out["caps"] == "0000000000000000", out
    assert out["environ parent"] == "PermissionError", out  # its parent is that PID 1
    assert {k: out[k] for k in OWN + ["own child"]} == dict.fromkeys(OWN + ["own child"], "done"), out


@needs_ns
@needs_seccomp
@needs_landlock
@pytest.mark.parametrize("without", ["", "landlock-scope"])
def test_with_a_pid_namespace_the_code_holds_no_capability(without):
    out = _result(attack(without, [], takeover=True))
    assert out["caps"] == "0000000000000000" and out["mem 1"] == "PermissionError", out
    assert {k: out[k] for k in OWN + ["own child"]} == dict.fromkeys(OWN + ["own child"], "done"), out


@needs_ns
def test_the_bootstrap_mounts_nothing_outside_the_sandboxs_own_namespaces(tmp_path):
    """Only PID 1 of the sandbox's namespaces mounts: run elsewhere as root, the directory's
    tmpfs and the hiding mounts would land on the host's /tmp. Here the bootstrap runs in a
    throwaway mount namespace (no PID namespace), where a mount would stay."""
    (tmp_path / "main.py").write_text("print('ran')")
    conf = {**SandboxLimits().__dict__, "workdir": str(tmp_path), "landlock_abi": 0, "seccomp": False,
            "dir_tmpfs": True, "hide_dirs": [str(tmp_path)], "keep": [], "read_dirs": [], "read_files": []}
    r = subprocess.run(["unshare", "--map-current-user", "--mount", sys.executable, "-I", "-c", sandbox.STUB,
                        json.dumps(conf)], capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert r.returncode == 125 and r.stdout == "", r
    assert "not in the sandbox's own mount namespace" in r.stderr and len(r.stderr.splitlines()) == 1, r.stderr


# what stops each attack, turned off one set at a time (no process started: the refusal comes first)
@pytest.mark.parametrize("walls, limits, words", [
    ({"seccomp": False}, {}, ["no seccomp", "Unix sockets", "allow_unix_sockets=True"]),
    ({"seccomp": False, "namespaces": False}, {"allow_unix_sockets": True},
     ["no network namespace and no seccomp", "allow_network=True"]),
    ({"seccomp": False, "namespaces": False, "landlock_abi": 5}, {"allow_unix_sockets": True, "allow_network": True},
     ["no PID namespace, Landlock older than ABI 6 and no seccomp", "kill(-1", "allow_host_processes=True"]),
    ({"seccomp": False, "namespaces": False}, {"allow_unix_sockets": True, "allow_network": True},
     ["no PID namespace and no seccomp", "prlimit", "allow_host_processes=True"]),
    ({"landlock_abi": 0}, {}, ["no Landlock", "~/.netrc", "allow_host_files=True"]),
    ({"landlock_abi": 0, "namespaces": False}, {}, ["no PID namespace and no Landlock", "/proc/<pid>/environ",
                                                    "allow_host_processes=True"]),
])
def test_a_wall_that_nothing_covers_is_named_with_its_override(monkeypatch, walls, limits, words):
    # (never a mount without the namespaces: as root it would land on the host's /tmp)
    patched = {**REAL, "dir_tmpfs": REAL["dir_tmpfs"] and walls.get("namespaces", True), **walls}
    monkeypatch.setattr(sandbox, "isolation", lambda: patched)
    r = run(run_python("print('ran')", SandboxLimits(**limits)))
    assert r.returncode == 125 and r.stdout == "" and len(r.stderr.splitlines()) == 1, r.stderr
    assert all(w in r.stderr for w in words), r.stderr
    every = dict.fromkeys(("allow_unix_sockets", "allow_network", "allow_host_processes", "allow_host_files"), True)
    if walls.get("landlock_abi", 0) <= REAL["landlock_abi"]:  # with the overrides it runs on the walls left
        r = run(run_python("print('ran')", SandboxLimits(**every)))
        assert r.stdout == "ran\n", r.text()


def test_the_test_switch_names_only_known_walls(monkeypatch):
    monkeypatch.setenv(WITHOUT_VAR, "namespace")
    with pytest.raises(ValueError, match=f"{WITHOUT_VAR}: unknown wall 'namespace'"):
        isolation()


def test_the_code_environment_is_refused_at_construction_where_the_sandbox_would_refuse(monkeypatch):
    """Pre-flight makes one instance of each environment: where the sandbox would refuse every call
    (here no Landlock: files outside its directory have no wall), the run stops there in one line
    naming the override in config terms, not after training on refusals."""
    from grpo_dist.envs.builtin import PythonCodeEnv
    from grpo_dist.envs.sandbox import WITHOUT_VAR

    monkeypatch.setenv(WITHOUT_VAR, "landlock")
    with pytest.raises(ValueError, match=r"no Landlock .*Set rollout\.env_kwargs \{allow: \[host_files\]\}"):
        PythonCodeEnv()
    env = PythonCodeEnv(allow=("host_files",))  # the user accepts the exposure
    assert env.sandbox.allow_host_files
    with pytest.raises(ValueError, match="allow: unknown"):
        PythonCodeEnv(allow=("everything",))
    monkeypatch.delenv(WITHOUT_VAR)
    assert not PythonCodeEnv().sandbox.allow_host_files  # all walls here: nothing to accept
