"""launch/netns_hosts.sh: hosts that reach each other's addresses but not each other's loopback,
with a private /tmp and HOME each, the project read-only, and nothing left after `down`."""

from __future__ import annotations

import subprocess

import pytest

from netns_hosts import ROOT, TEST_ENV, hosts_fixture

LISTEN = ("import socket, sys, time; s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); "
          "s.bind((sys.argv[1], 7077)); s.listen(); print('ready', flush=True); c, _ = s.accept(); "
          "c.sendall(b'hello from ' + sys.argv[2].encode()); time.sleep(1)")
CONNECT = ("import socket, sys\ntry:\n    s = socket.create_connection((sys.argv[1], 7077), timeout=3); "
           "print(s.recv(100).decode())\nexcept OSError as e:\n    print('failed', type(e).__name__)")


@pytest.fixture(scope="module")
def hosts():
    yield from hosts_fixture(2)


def _serve(hosts, i: int, bind: str) -> subprocess.Popen:
    p = hosts.popen(i, "python3", "-c", LISTEN, bind, f"host{i}", stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "ready"
    return p


def _connect(hosts, i: int, to: str) -> str:
    r = hosts.run(i, "python3", "-c", CONNECT, to)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


def test_hosts_reach_each_others_address_not_each_others_loopback(hosts):
    srv = _serve(hosts, 2, "0.0.0.0")
    try:
        assert _connect(hosts, 1, hosts.addr(2)) == "hello from host2"
    finally:
        srv.wait(timeout=10)
    srv = _serve(hosts, 2, "127.0.0.1")
    try:
        assert _connect(hosts, 1, "127.0.0.1").startswith("failed")  # host 1's own loopback: nobody there
        assert _connect(hosts, 2, "127.0.0.1") == "hello from host2"
    finally:
        srv.wait(timeout=10)
    r = hosts.run(1, "ip", "-4", "route")
    assert r.stdout.split() and "default" not in r.stdout, r.stdout  # the subnet only: no way out


def test_link_down_cuts_the_host_off_and_up_restores_it(hosts):
    srv = _serve(hosts, 2, "0.0.0.0")
    try:
        assert hosts.script("link", "2", "down").returncode == 0
        assert _connect(hosts, 1, hosts.addr(2)).startswith("failed")
        assert hosts.script("link", "2", "up").returncode == 0
        assert _connect(hosts, 1, hosts.addr(2)) == "hello from host2"
    finally:
        srv.kill()
        srv.wait()


def test_tmp_and_home_are_private_and_the_project_read_only(hosts):
    r = hosts.run(1, "bash", "-c", "echo one > /tmp/mark && echo $HOME && cat /tmp/mark")
    assert r.returncode == 0 and r.stdout.split() == [str(hosts.home(1)), "one"], r.stdout + r.stderr
    r = hosts.run(2, "bash", "-c", "ls /tmp; echo $HOME")
    assert "mark" not in r.stdout and r.stdout.split()[-1] == str(hosts.home(2)), r.stdout
    assert (hosts.state / "h1" / "tmp" / "mark").exists() and not (hosts.state / "h2" / "tmp" / "mark").exists()
    r = hosts.run(1, "bash", "-c", f"touch {ROOT}/.netns_write_probe")
    assert r.returncode != 0 and "Read-only" in r.stderr, r.stderr
    r = hosts.run(1, "bash", "-c", f"echo x > {hosts.shared}/from1")
    assert r.returncode == 0 and hosts.run(2, "cat", f"{hosts.shared}/from1").stdout.strip() == "x"
    assert hosts.script("private", "2", str(hosts.shared)).returncode == 0  # host 2 loses the shared mount
    r = hosts.run(2, "bash", "-c", f"ls {hosts.shared}")
    assert r.returncode == 0 and r.stdout.strip() == "", r.stdout
    assert hosts.run(1, "cat", f"{hosts.shared}/from1").stdout.strip() == "x"  # host 1 still has it


def test_each_host_has_its_own_hostname_and_process_table(hosts):
    sleeper = hosts.popen(2, "sleep", "60")
    try:
        for i in (1, 2):
            r = hosts.run(i, "python3", "-c", "import socket; print(socket.gethostbyname(socket.gethostname()))")
            assert r.stdout.strip() == hosts.addr(i), r.stdout + r.stderr  # its name resolves to its address
            r = hosts.run(i, "bash", "-c", "hostname; ps -e -o args=")
            name, procs = r.stdout.split("\n", 1)
            assert name == f"host{i}" and ("sleep 60" in procs) == (i == 2), r.stdout  # host 1 sees none of host 2's
        r = hosts.script("kill", "2")
        assert r.returncode == 0 and sleeper.wait(timeout=10) != 0
        assert hosts.run(2, "true").returncode == 0  # the host itself lives on (its holder is spared)
    finally:
        sleeper.kill()
        sleeper.wait()


def test_down_removes_namespaces_bridge_veths_and_state():  # last: it takes the module's hosts down too
    from netns_hosts import Hosts, why_not

    if why_not():
        pytest.skip(why_not())
    h = Hosts(2)
    h.script("down")
    assert h.script("up", "2").returncode == 0
    sleeper = h.popen(1, "sleep", "300")
    r = h.script("down", timeout=60)
    assert r.returncode == 0, r.stderr
    assert sleeper.wait(timeout=10) != 0
    pre = TEST_ENV["GD_HOSTS_PREFIX"]
    assert not [ln for ln in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split()
                if ln.startswith(pre + "h")]
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    assert f"{pre}br0" not in links and f"{pre}h1v" not in links
    assert TEST_ENV["GD_HOSTS_NET"] + "." not in subprocess.run(["ip", "-4", "addr"], capture_output=True,
                                                                 text=True).stdout
    assert not h.state.exists()
