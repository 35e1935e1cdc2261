"""The code tool's sandbox keeps model-written code away from every Unix socket outside it
(issue 41): pathname sockets under /tmp and /run, abstract ones, and a running Ray session's
raylet and object store. Each wall is also tried alone (the hidden directories without the filter,
the filter with the directories in view), so losing one shows."""

from __future__ import annotations

import contextlib
import json
import os
import select
import shutil
import socket
import subprocess
import sys
import tempfile
import threading

import pytest

from grpo_dist.envs import sandbox
from grpo_dist.envs.base import run
from grpo_dist.envs.sandbox import STUB, SandboxLimits, isolation, run_python

ISO = isolation()
KINDS = ("STREAM", "DGRAM", "SEQPACKET")


def attack(addr: str) -> str:
    """Code that tries every way it knows to send bytes to ``addr`` (a path, or "\\0name")."""
    return f"""
import socket
addr = {addr!r}
for kind in {KINDS!r}:
    try:
        s = socket.socket(socket.AF_UNIX, getattr(socket, "SOCK_" + kind))
        s.settimeout(3)
        s.connect(addr)
        s.send(b"escape")
        print(kind, "reached")
    except OSError as e:
        print(kind, type(e).__name__)
for kind in {KINDS!r}:
    try:
        a, b = socket.socketpair(socket.AF_UNIX, getattr(socket, "SOCK_" + kind))
    except OSError as e:
        print("pair", kind, type(e).__name__)
        continue
    try:
        a.connect(addr)
        print("pair", kind, "connected")
    except OSError as e:
        print("pair", kind, "connect", type(e).__name__)
    try:
        a.sendto(b"escape", addr)
        print("pair", kind, "sent")
    except OSError as e:
        print("pair", kind, "sendto", type(e).__name__)
"""


class Listener:
    """Unix sockets of every kind listening at ``addr`` + a suffix; records what reaches them."""

    def __init__(self, addr: str):
        self.addrs = {k: f"{addr}-{k.lower()}" for k in KINDS}
        self.got: list[str] = []
        self.socks = {}
        for k, a in self.addrs.items():
            s = socket.socket(socket.AF_UNIX, getattr(socket, "SOCK_" + k))
            s.bind(a)
            if k != "DGRAM":
                s.listen(4)
            s.setblocking(False)
            self.socks[k] = s
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self):
        while not self.stop.is_set():
            ready, _, _ = select.select(list(self.socks.values()), [], [], 0.1)
            for s in ready:
                kind = next(k for k, v in self.socks.items() if v is s)
                if kind == "DGRAM":
                    self.got.append(f"{kind} {s.recv(64)!r}")
                else:
                    conn, _ = s.accept()
                    self.got.append(f"{kind} connection")
                    conn.close()

    def close(self):
        self.stop.set()
        self.thread.join(5)
        for s in self.socks.values():
            s.close()


def assert_refused(out: str) -> None:
    lines = out.splitlines()
    for k in KINDS:  # every attempt ran (a socket of each kind, a pair of each kind)
        assert any(ln.startswith(f"{k} ") for ln in lines) and any(ln.startswith(f"pair {k} ") for ln in lines), out
    # (a SEQPACKET pair's sendto ignores the address: its bytes go to its own peer; the listeners
    # check that nothing arrived)
    assert not [ln for ln in lines if ln.endswith(("reached", "connected", "sent"))
                and ln != "pair SEQPACKET sent"], out


@contextlib.contextmanager
def listening(where: str):
    """A :class:`Listener` under /tmp, /run or another directory (an absolute path; in a directory
    of its own, ``.dir``), or on an abstract name; closed and removed afterwards."""
    d = None
    if where == "abstract":
        addr = f"\0grpo-sandbox-test-{os.getpid()}"
    else:
        try:
            d = tempfile.mkdtemp(prefix="grpo-sock-", dir=where if where.startswith("/") else f"/{where}")
        except OSError as e:
            pytest.skip(f"cannot make a directory in /{where}: {e}")
        addr = os.path.join(d, "s")
    lis = Listener(addr)
    lis.dir = d
    try:
        yield lis
    finally:
        lis.close()
        if d:
            shutil.rmtree(d, ignore_errors=True)


@pytest.mark.skipif(not ISO["seccomp"], reason="no seccomp filters here: the sandbox refuses to run code")
@pytest.mark.parametrize("where", ["tmp", "run", "abstract"])
def test_code_cannot_reach_a_unix_socket_outside(where):
    with listening(where) as lis:
        # the listener is reachable from outside the sandbox: the door is real
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        probe.connect(lis.addrs["STREAM"])
        probe.close()
        outs = [run(run_python(attack(a))) for a in lis.addrs.values()]
    for r in outs:
        assert r.returncode == 0, r.text()
        assert_refused(r.stdout)
        assert "STREAM PermissionError" in r.stdout.splitlines()  # socket() itself is refused
    assert lis.got == ["STREAM connection"]  # the probe's, and nothing from the sandbox


def _stub(conf_extra: dict, code: str, namespaces: bool) -> subprocess.CompletedProcess:
    """The sandbox's bootstrap with chosen walls only."""
    work = tempfile.mkdtemp(prefix="grpo-sandbox-")
    try:
        with open(os.path.join(work, "main.py"), "w") as f:
            f.write(code)
        conf = {**SandboxLimits().__dict__, "workdir": work, "landlock_abi": 0, "seccomp": False,
                "dir_tmpfs": False, "hide_dirs": [], "keep": [os.path.dirname(sys.executable)], "read_dirs": [],
                "read_files": [], **conf_extra}
        argv = (sandbox._UNSHARE if namespaces else []) + [sys.executable, "-I", "-c", STUB, json.dumps(conf)]
        return subprocess.run(argv, capture_output=True, text=True, timeout=60, cwd=work,
                              env={"PATH": "/usr/bin:/bin", "HOME": work, "TMPDIR": work})
    finally:
        shutil.rmtree(work, ignore_errors=True)


@pytest.mark.skipif(not ISO["dir_tmpfs"], reason="no mount namespace here")
def test_the_hidden_directories_alone_keep_host_sockets_out_of_sight():
    with listening("tmp") as lis:
        code = (f"import os, sys\nprint(os.path.exists({lis.dir!r}), sorted(os.listdir('/run')), os.listdir('.'))\n"
                + attack(lis.addrs["STREAM"]))
        r = _stub({"hide_dirs": sandbox.socket_dirs()}, code, namespaces=True)
    assert r.returncode == 0, r.stderr
    first, rest = r.stdout.split("\n", 1)
    assert first == "False [] ['main.py']"  # /tmp and /run are empty; its own directory is there
    assert "STREAM FileNotFoundError" in rest.splitlines()
    assert_refused(rest)
    assert lis.got == []


@pytest.mark.skipif(not ISO["seccomp"], reason="no seccomp filters here")
def test_the_filter_alone_refuses_sockets_in_plain_view():
    with listening("tmp") as lis:
        code = (f"import os, socket\nprint(os.path.exists({lis.addrs['STREAM']!r}))\n"
                "a, b = socket.socketpair()\na.sendall(b'pair ok')\nprint(b.recv(16).decode())\n"
                + attack(lis.addrs["DGRAM"]))
        r = _stub({"seccomp": True}, code, namespaces=False)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[:2] == ["True", "pair ok"]  # in view, and a connected stream pair still works
    assert_refused("\n".join(lines[2:]))
    assert [ln for ln in lines if ln.startswith("pair DGRAM")] == ["pair DGRAM PermissionError"]
    assert lis.got == []


@contextlib.contextmanager
def scratch_dir():
    """A short directory outside every directory the sandbox hides by name (a scratch disk's
    ``TMPDIR``): beneath the home; removed afterwards."""
    d = tempfile.mkdtemp(prefix="g", dir=os.path.expanduser("~"))
    try:
        assert not any(os.path.realpath(d).startswith(h + "/") for h in map(os.path.realpath, sandbox.SOCKET_DIRS)), d
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


@pytest.mark.skipif(not ISO["dir_tmpfs"], reason="no mount namespace here")
def test_sockets_under_the_temporary_directory_are_hidden_wherever_it_is(monkeypatch):
    """``TMPDIR=/scratch/tmp``: a local cluster's session lives there (local_auth.private_temp_dir),
    so the sandbox hides that directory too, by the hiding wall alone and with every wall."""
    with scratch_dir() as base:
        monkeypatch.setenv("TMPDIR", base)
        monkeypatch.setattr(tempfile, "tempdir", None)
        with listening(base) as lis:
            code = f"import os\nprint(os.path.exists({lis.dir!r}), os.getcwd().startswith({base!r}))\n"
            alone = _stub({"hide_dirs": sandbox.socket_dirs()}, code + attack(lis.addrs["STREAM"]), namespaces=True)
            full = run(run_python(code))
    assert alone.returncode == 0, alone.stderr
    first, rest = alone.stdout.split("\n", 1)
    assert first == "False True"  # out of sight; its own directory, beneath it, bound back
    assert "STREAM FileNotFoundError" in rest.splitlines()
    assert_refused(rest)
    assert full.ok and full.stdout == "False True\n", full.text()
    assert lis.got == []


def test_without_a_socket_wall_the_sandbox_refuses_to_run(monkeypatch):
    monkeypatch.setattr(sandbox, "isolation", lambda: {**ISO, "seccomp": False, "unix_sockets": "not cut"})
    r = run(run_python("print('ran')"))
    assert r.returncode == 125 and r.stdout == "" and "Unix sockets" in r.stderr and not r.ok


@pytest.mark.slow
@pytest.mark.skipif(not ISO["seccomp"], reason="no seccomp filters here: the sandbox refuses to run code")
def test_code_cannot_reach_the_running_ray_sessions_sockets(ray_cluster, monkeypatch):
    """The session started under another ``TMPDIR`` than the sandbox's parent has now: the live
    session's own directories are hidden."""
    import ray

    from grpo_dist.cluster.ray_utils import init_ray, shutdown_ray
    from grpo_dist.config import load_config

    with scratch_dir() as base:
        try:
            with monkeypatch.context() as m:
                m.setenv("TMPDIR", base)
                m.setattr(tempfile, "tempdir", None)
                init_ray(load_config(None, {"cluster": {"num_cpus": 2}}))
            node = ray._private.worker.global_worker.node
            socks = [node.raylet_socket_name, node.plasma_store_socket_name]
            assert all(os.path.exists(s) and s.startswith(base) for s in socks), socks
            assert tempfile.gettempdir() != base
            for s in socks:
                r = run(run_python(f"import os\nprint(os.path.exists({s!r}))\n" + attack(s)))
                assert r.returncode == 0, r.text()
                first, rest = r.stdout.split("\n", 1)
                assert first == str(not ISO["dir_tmpfs"])  # out of sight wherever a mount can hide it
                assert_refused(rest)
            assert ray.get(ray.remote(lambda: 1).remote()) == 1  # the cluster is unharmed
        finally:
            shutdown_ray()
