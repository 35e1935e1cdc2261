"""The code tool's sandbox (grpo_dist/envs/sandbox.py) against hostile code: a loop that never
ends, a sleep that never ends, unbounded allocation, gigabytes of output, reading the parent's
environment (its own, and /proc/<parent>/environ), writing outside its directory, the network,
and processes left behind. Limits are generous in wall-clock terms: the machine is shared, and a
CPU second can take many wall seconds under load."""

from __future__ import annotations

import os
import socket
import time

import pytest

from grpo_dist.envs import EnvLimits
from grpo_dist.envs.base import run
from grpo_dist.envs.builtin import PythonCodeEnv
from grpo_dist.envs.sandbox import SandboxLimits, isolation, run_python_sync
from grpo_dist.types import PromptRecord

ISO = isolation()


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
    assert r.stdout.splitlines() == ["ok", "PermissionError", "PermissionError", "PermissionError", "PermissionError"]
    assert not target.exists() and not os.path.exists("/tmp/grpo-sandbox-escape") and (tmp_path / "keep").exists()


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
