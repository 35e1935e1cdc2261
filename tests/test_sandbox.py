"""The code tool's sandbox (grpo_dist/envs/sandbox.py) against hostile code: a loop that never
ends, a sleep that never ends, unbounded allocation, gigabytes of output, reading the parent's
environment (its own, and /proc/<parent>/environ), reading the home, the project or other files,
writing outside its directory, filling its directory, forbidden system calls, the network, and
processes left behind. Limits are generous in wall-clock terms: the machine is shared, and a
CPU second can take many wall seconds under load."""

from __future__ import annotations

import importlib.util
import json
import os
import platform
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from grpo_dist.envs import EnvLimits
from grpo_dist.envs.base import run
from grpo_dist.envs.builtin import PythonCodeEnv
from grpo_dist.envs._seccomp import _DENIED
from grpo_dist.envs.sandbox import STUB, SandboxLimits, isolation, run_python
from grpo_dist.types import PromptRecord

ISO = isolation()
# Landlock's refusal, or a path beneath a directory the sandbox hides (/tmp, /run: test_sandbox_sockets.py)
REFUSED = {"PermissionError", "FileNotFoundError"}



def run_python_sync(code: str, limits: SandboxLimits | None = None):
    """The code tool's coroutine run to its end (the environments' event loop)."""
    return run(run_python(code, limits))

def test_plain_code_runs_in_an_empty_directory_that_is_removed():
    r = run_python_sync("import os, sys\nprint(os.listdir('.'), os.getcwd() == os.environ['HOME'])\nprint(6 * 7)")
    assert r.ok and r.stdout.splitlines() == ["['main.py'] True", "42"]
    work = r.stdout  # the directory is gone afterwards
    r = run_python_sync("import os; print(os.getcwd())")
    assert r.ok and not os.path.exists(r.stdout.strip()) and work


def test_a_loop_that_never_ends_is_killed_by_the_cpu_limit():
    t0 = time.monotonic()
    r = run_python_sync("while True:\n    pass", SandboxLimits(cpu_s=1, wall_s=120))
    assert not r.timed_out and r.returncode is not None and r.returncode != 0
    assert "SIGXCPU" in r.text() or "SIGKILL" in r.text()
    assert time.monotonic() - t0 < 120


def test_a_sleep_that_never_ends_is_killed_at_the_wall_clock_limit():
    t0 = time.monotonic()
    r = run_python_sync("import time\nprint('start', flush=True)\ntime.sleep(1000)", SandboxLimits(wall_s=3))
    assert r.timed_out and r.stdout == "start\n" and "[killed: wall-clock timeout]" in r.text()
    assert time.monotonic() - t0 < 30


def test_unbounded_allocation_fails_inside_the_memory_limit():
    r = run_python_sync("x = []\nwhile True:\n    x.append(bytearray(10 ** 7))", SandboxLimits(memory_mb=256, wall_s=120))
    assert r.returncode != 0 and not r.timed_out and "MemoryError" in r.stderr


def test_gigabytes_of_output_stop_at_the_output_limit():
    t0 = time.monotonic()
    r = run_python_sync("import sys\nwhile True:\n    sys.stdout.write('x' * 65536)", SandboxLimits(output_bytes=10000,
                                                                                                 wall_s=120))
    assert r.output_truncated and len(r.stdout) + len(r.stderr) <= 10000 and not r.timed_out
    assert r.text().endswith("[output cut: more than the sandbox's output limit]")
    assert time.monotonic() - t0 < 60


def test_the_parents_environment_is_out_of_reach(monkeypatch):
    monkeypatch.setenv("GRPO_TEST_SECRET", "hunter2-sandbox")
    code = ("import os, glob\n"
            "print(sorted(os.environ))\n"
            "leaks = []\n"
            "for p in glob.glob('/proc/[0-9]*/environ') + ['/proc/%d/environ' % os.getppid()]:\n"
            "    try:\n"
            "        if b'hunter2-sandbox' in open(p, 'rb').read():\n"
            "            leaks.append(p)\n"
            "    except OSError:\n"
            "        pass\n"
            "print('leaks', leaks)\n")
    r = run_python_sync(code)
    assert r.ok, r.text()
    assert r.stdout.splitlines()[0] == "['HOME', 'LANG', 'PATH', 'TMPDIR']"
    if not ISO["namespaces"]:
        pytest.skip("no unshare here: /proc/<parent>/environ is readable (sandbox.py says so)")
    assert r.stdout.splitlines()[1] == "leaks []"


@pytest.mark.skipif(isolation()["landlock_abi"] < 1, reason="no Landlock on this kernel: writes are not confined")
def test_writes_outside_its_directory_are_refused(tmp_path):
    target = tmp_path / "escaped.txt"
    code = (f"import os\nopen('inside.txt', 'w').write('ok')\nprint(open('inside.txt').read())\n"
            f"for p in [{str(target)!r}, '/tmp/grpo-sandbox-escape', os.path.expanduser('~/../x')]:\n"
            f"    try:\n        open(p, 'w').write('x')\n        print('wrote', p)\n"
            f"    except OSError as e:\n        print(type(e).__name__)\n"
            f"try:\n    os.remove({str(target.parent)!r} + '/keep')\nexcept OSError as e:\n    print(type(e).__name__)\n")
    (tmp_path / "keep").write_text("keep")
    r = run_python_sync(code)
    out = r.stdout.splitlines()
    assert out[0] == "ok" and len(out) == 5 and set(out[1:]) <= REFUSED, out
    assert not target.exists() and not os.path.exists("/tmp/grpo-sandbox-escape") and (tmp_path / "keep").exists()


@pytest.mark.skipif(isolation()["landlock_abi"] < 1, reason="no Landlock on this kernel: reads are not confined")
def test_the_home_the_project_and_other_files_are_unreadable(tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("hunter2")
    project = Path(__file__).resolve().parents[1]
    targets = [str(Path.home()), str(project / "pyproject.toml"), str(Path(__file__).resolve()), str(project),
               str(secret), str(tmp_path), "/etc/passwd", "/tmp", "/"]
    code = ("import os, decimal, fractions\n"
            "print(open('main.py').read().startswith('import os'), decimal.Decimal('0.1') + decimal.Decimal('0.2'))\n"
            f"for p in {targets!r}:\n"
            "    try:\n"
            "        print(os.listdir(p) if os.path.isdir(p) else open(p).read()[:20])\n"
            "    except OSError as e:\n"
            "        print(type(e).__name__)\n")
    if importlib.util.find_spec("numpy"):  # the environment's site-packages stay importable
        code += "import numpy\nprint(int(numpy.arange(4).sum()))\n"
    r = run_python_sync(code)
    assert r.ok, r.text()
    lines = r.stdout.splitlines()
    assert lines[0] == "True 0.3" and set(lines[1:1 + len(targets)]) <= REFUSED, lines
    assert lines[1 + len(targets):] == (["6"] if importlib.util.find_spec("numpy") else [])


@pytest.mark.skipif(not isolation()["dir_tmpfs"], reason="no user and mount namespaces here: the directory's size is "
                    "bounded per file only")
def test_filling_its_directory_stops_at_the_size_bound():
    lim = SandboxLimits(dir_mb=8, file_mb=3, dir_files=64, wall_s=60)
    code = ("import errno, os\n"
            "def fill(make):\n"
            "    try:\n"
            "        for i in range(1000):\n"
            "            make(i)\n"
            "    except OSError as e:\n"
            "        return errno.errorcode[e.errno]\n"
            "def big(i):\n"
            "    with open('big%d' % i, 'wb') as f:\n"
            "        for _ in range(3):\n"
            "            f.write(b'x' * (1 << 20))\n"
            "            f.flush()\n"
            "print(fill(lambda i: open('one', 'ab').write(b'x' * (1 << 20))))\n"  # one file past file_mb
            "os.remove('one')\n"
            "print(fill(big))\n"  # the directory past dir_mb
            "print(sum(os.path.getsize(n) for n in os.listdir('.')) <= 8 << 20)\n"
            "for n in os.listdir('.'):\n"
            "    if n != 'main.py':\n"
            "        os.remove(n)\n"
            "print(fill(lambda i: open('f%d' % i, 'w').close()), len(os.listdir('.')) <= 64)\n")  # past dir_files
    r = run_python_sync(code, lim)
    assert r.ok, r.text()
    assert r.stdout.splitlines() == ["EFBIG", "ENOSPC", "True", "ENOSPC True"]


@pytest.mark.skipif(not isolation()["seccomp"], reason="no seccomp filters on this kernel or architecture")
def test_forbidden_system_calls_fail():
    col = 0 if platform.machine() in ("x86_64", "amd64") else 1
    nr = {k: _DENIED[k][col] for k in ("ptrace", "unshare", "io_uring_setup", "keyctl", "bpf", "mount")}
    code = ("import ctypes, os, socket, threading\n"
            "libc = ctypes.CDLL(None, use_errno=True)\n"
            "params = ctypes.create_string_buffer(256)\n"
            f"calls = [('ptrace', {nr['ptrace']}, 0, 0, 0, 0), ('unshare', {nr['unshare']}, 0x10000000),\n"
            f"         ('unshare', {nr['unshare']}, 0x40000000), ('io_uring_setup', {nr['io_uring_setup']}, 4, params),\n"
            f"         ('keyctl', {nr['keyctl']}, 0, -3, 0), ('bpf', {nr['bpf']}, 0, 0, 0),\n"
            f"         ('mount', {nr['mount']}, b'none', b'/tmp', b'tmpfs', 0, None)]\n"
            "for name, n, *args in calls:\n"
            "    rc = libc.syscall(n, *args)\n"
            "    print(name, rc, os.strerror(ctypes.get_errno()) if rc < 0 else '')\n"
            "for fam in (socket.AF_INET, socket.AF_INET6, socket.AF_NETLINK, socket.AF_PACKET):\n"
            "    try:\n"
            "        socket.socket(fam, socket.SOCK_RAW if fam == socket.AF_PACKET else socket.SOCK_DGRAM)\n"
            "        print('socket', fam)\n"
            "    except OSError as e:\n"
            "        print(type(e).__name__)\n"
            "a, b = socket.socketpair()\n"
            "a.sendall(b'unix ok')\n"
            "t = threading.Thread(target=lambda: print(b.recv(16).decode()))\n"
            "t.start()\n"
            "t.join()\n"
            "print([l for l in open('/proc/self/status') if l.startswith('Seccomp:')][0].split())\n")
    r = run_python_sync(code)
    assert r.ok, r.text()
    refused = "-1 Operation not permitted"
    assert r.stdout.splitlines() == [f"ptrace {refused}", f"unshare {refused}", f"unshare {refused}",
                                     f"io_uring_setup {refused}", f"keyctl {refused}", f"bpf {refused}",
                                     f"mount {refused}"] + ["PermissionError"] * 4 + ["unix ok", "['Seccomp:', '2']"]


@pytest.mark.skipif(isolation()["landlock_abi"] < 1, reason="no Landlock on this kernel")
def test_a_wall_that_cannot_be_applied_stops_the_code(tmp_path):
    """Fails closed: a Landlock rule the kernel rejects (a file given as a directory) -> exit 125."""
    (tmp_path / "main.py").write_text("print('ran')")
    conf = {**SandboxLimits().__dict__, "workdir": str(tmp_path), "landlock_abi": isolation()["landlock_abi"],
            "seccomp": False, "dir_tmpfs": False, "read_dirs": ["/etc/hostname"], "read_files": []}
    r = subprocess.run([sys.executable, "-I", "-c", STUB, json.dumps(conf)], capture_output=True, text=True,
                       timeout=60, cwd=tmp_path)
    assert r.returncode == 125 and r.stdout == "" and "Landlock could not be applied" in r.stderr


def test_no_network():
    if ISO["network"] == "not cut":
        pytest.skip("no network namespace nor Landlock TCP rule here")
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    port = srv.getsockname()[1]
    try:
        r = run_python_sync(f"import socket\ntry:\n    socket.create_connection(('127.0.0.1', {port}), timeout=5)\n"
                            f"    print('connected')\nexcept OSError as e:\n    print(type(e).__name__)")
    finally:
        srv.close()
    assert r.ok and r.stdout.strip() in ("PermissionError", "ConnectionRefusedError", "OSError")


def test_processes_it_starts_die_with_it():
    if not ISO["namespaces"]:
        pytest.skip("no PID namespace here")
    marker = f"grpo-sandbox-orphan-{os.getpid()}"
    code = ("import subprocess, sys\n"
            f"for _ in range(3):\n    subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)', '{marker}'],"
            " start_new_session=True)\n"
            "print('started', flush=True)\nimport time; time.sleep(600)\n")
    r = run_python_sync(code, SandboxLimits(wall_s=15))
    assert r.timed_out and r.stdout == "started\n"
    time.sleep(1)
    left = [p for p in os.listdir("/proc") if p.isdigit() and _cmdline_has(p, marker)]
    assert left == []


def _cmdline_has(pid: str, marker: str) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return marker.encode() in f.read()
    except OSError:
        return False


def test_the_python_tool_environment_runs_code_and_reports_failures():
    env = PythonCodeEnv(system_prompt=None, limits=EnvLimits(tool_timeout_s=60))
    env.reset(PromptRecord(0, "q", {"answer": "1344"}))
    assert env.tools[0]["function"]["name"] == "python" and "code" in env.tools[0]["function"]["parameters"]["required"]
    ok = run(env.step('<tool_call>{"name": "python", "arguments": {"code": "print(84 * 16)"}}</tool_call>'))
    assert ok.messages[0]["content"] == "1344" and ok.info["tool_errors"] == 0
    bad = run(env.step('<tool_call>{"name": "python", "arguments": {"code": "print(1/0)"}}</tool_call>'))
    assert "ZeroDivisionError" in bad.messages[0]["content"] and "[exit 1]" in bad.messages[0]["content"]
    assert run(env.step("The answer is 1344.")).reward == 1.0
