"""launch/start_head.sh, start_worker.sh and stop_cluster.sh run as docs/security.md says, in a user's
environment: where every process of the node listens, and a stop that takes exactly those processes.

Ray swaps a node address of 127.0.0.1 for the host's network address (and then listens on all
interfaces) unless RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 is set: the head script sets it for the
default, loopback head. A head on another address (here 127.0.0.2, a private address that stays on
this machine) listens on it, and on all interfaces for the ports docs/security.md lists.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from cluster_scripts import ROOT, alive, start_head, start_worker, stop

pytestmark = pytest.mark.slow
LOOPBACK = {"127.0.0.1", "::ffff:127.0.0.1"}
ANY = {"*", "0.0.0.0", "::"}


def _decoy(tmp_path):
    """A process that looks like Ray's (name and command line) but is not this node's: `ray stop`
    matches such names; stop_cluster.sh must leave it alone."""
    script = tmp_path / "gcs_server"
    script.write_text("#!/bin/sh\nexec sleep 600\n")
    script.chmod(0o755)
    return subprocess.Popen(["bash", "-c", f"exec -a 'ray::IDLE gcs_server raylet' {script}"], start_new_session=True)


def _driver_with_actor(head, env_extra: dict) -> tuple[subprocess.Popen, int]:
    """A driver (its own session, not the head's) holding one actor; returns it and the actor's pid."""
    code = ("import os, ray, sys, time\n"
            f"ray.init(address='{head.address}')\n"
            "@ray.remote(num_cpus=0)\nclass A:\n    def pid(self): return os.getpid()\n"
            "a = A.remote(); print(ray.get(a.pid.remote()), flush=True); time.sleep(600)\n")
    env = dict(head.env, RAY_AUTH_MODE="token", RAY_AUTH_TOKEN_PATH=f"{head.env['HOME']}/.ray/auth_token", **env_extra)
    p = subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                         text=True, start_new_session=True)
    line = p.stdout.readline()
    assert line.strip().isdigit(), f"the driver got no actor (exit {p.poll()})"
    return p, int(line)


def test_default_head_listens_on_loopback_only_and_stops_exactly_its_processes(tmp_path):
    head = start_head(tmp_path / "home")
    decoy = _decoy(tmp_path)
    # a driver on this machine joins a loopback head with RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 (grpo-dist sets it)
    driver, actor_pid = _driver_with_actor(head, {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"})
    try:
        pids = head.pids()
        assert actor_pid in pids and decoy.pid not in pids and driver.pid not in pids, pids
        listening = head.listening()
        names = {n for _, _, n in listening}
        assert {"gcs_server", "raylet"} <= names, listening
        by_port = {port: host for host, port, _ in listening}
        p = head.ports
        for name in ("gcs", "dashboard", "client", "node_manager", "object_manager", "agent_http", "agent_grpc",
                     "runtime_env", "metrics", "autoscaler_metrics",
                     "dashboard_metrics"):  # each port docs/security.md lists, as chosen by its flag
            assert p[name] in by_port, (name, listening)
        assert any(p["workers"] <= port <= p["workers"] + 20 for port in by_port), listening  # the actor's worker
        assert {host for host, _, _ in listening} <= LOOPBACK, listening  # not the host's address, not *
        assert "every port on 127.0.0.1" in head.out and "launch/stop_cluster.sh " + str(head.pid_file) in head.out

        r, took = stop(head)
        assert r.returncode == 0, r.stdout + r.stderr
        assert "stopped" in r.stdout, r.stdout
        print(f"stop_cluster.sh: {took:.1f} s: {r.stdout.strip()} {r.stderr.strip()}")
        assert took < 40, took
        assert not [pid for pid in pids if alive(pid)], {pid: n for pid, n in pids.items() if alive(pid)}
        assert alive(decoy.pid) and driver.poll() is None  # not the head's: left alone
        assert not head.pid_file.exists()
        r, _ = stop(head, "head")
        assert r.returncode == 0 and "nothing to stop" in r.stdout
    finally:
        for p in (decoy, driver):
            p.kill()
            p.wait()
        if head.pid_file.exists():
            stop(head)


def test_private_address_head_and_worker_listen_as_documented_and_stop_one_by_one(tmp_path):
    """Head on 127.0.0.2, a worker node on 127.0.0.3 joining it (one machine, two raylets)."""
    head = start_head(tmp_path / "head_home", node_ip="127.0.0.2")
    worker = None
    try:
        assert "Ray listens on all interfaces" in head.out
        p = head.ports
        wildcard_ok = {p["gcs"], p["node_manager"], p["object_manager"], p["agent_grpc"], p["metrics"],
                       p["autoscaler_metrics"], p["dashboard_metrics"]}
        for host, port, name in head.listening():
            if host in ANY:
                assert port in wildcard_ok, (host, port, name)  # docs/security.md's list, nothing else
            else:
                assert host in {"127.0.0.2", "::ffff:127.0.0.2"} | LOOPBACK, (host, port, name)
        assert ("127.0.0.1", p["dashboard"]) in {(h, pt) for h, pt, _ in head.listening()}

        worker = start_worker(tmp_path / "worker_home", head, "127.0.0.3")
        w = worker.ports
        wildcard_ok = {w["node_manager"], w["object_manager"], w["agent_grpc"], w["metrics"]}
        for host, port, name in worker.listening():
            assert port in wildcard_ok if host in ANY else host in {"127.0.0.3", "::ffff:127.0.0.3"} | LOOPBACK, \
                (host, port, name)
        head_pids, worker_pids = head.pids(), worker.pids()
        assert not set(head_pids) & set(worker_pids)

        r, took = stop(worker, "worker")  # the worker only
        assert r.returncode == 0 and "worker" in r.stdout, r.stdout + r.stderr
        assert not [pid for pid in worker_pids if alive(pid)]
        assert all(alive(pid) for pid in head_pids if head_pids[pid] in ("gcs_server", "raylet"))
        r, took = stop(head)
        assert r.returncode == 0 and took < 40, (r.stdout + r.stderr, took)
        assert not [pid for pid in head_pids if alive(pid)]
    finally:
        for n in (worker, head):
            if n is not None and n.pid_file.exists():
                stop(n)


def test_a_second_head_on_the_same_port_is_refused_and_block_mode_stops_on_sigterm(tmp_path):
    """`start_head.sh --block` stays in the foreground; SIGTERM to it stops the whole head."""
    from cluster_scripts import node_ports, port_args, user_env

    home = tmp_path / "home"
    ports = node_ports(head=True)
    env = user_env(home, RAY_PORT=str(ports["gcs"]), RAY_DASHBOARD_PORT=str(ports["dashboard"]))
    proc = subprocess.Popen(["bash", "launch/start_head.sh", "--num-cpus", "1", "--block", *port_args(ports)],
                            cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    pid_file = home / ".ray" / "grpo_dist" / f"head-{ports['gcs']}.json"
    deadline = time.time() + 180
    while not pid_file.exists() and time.time() < deadline and proc.poll() is None:
        time.sleep(1)
    assert pid_file.exists(), f"no pid file (exit {proc.poll()})"
    t0 = time.monotonic()
    r = subprocess.run(["bash", "launch/start_head.sh", "--num-cpus", "1", *port_args(ports)], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "still running" in r.stderr, r.stdout + r.stderr
    print(f"second head on a live head's port: exit {r.returncode} in {time.monotonic() - t0:.1f} s: "
          f"{r.stderr.strip().splitlines()[-1]}")
    out = subprocess.run([sys.executable, "launch/_procs.py", "list", str(pid_file)], cwd=ROOT, capture_output=True,
                         text=True).stdout
    pids = [int(ln.split()[0]) for ln in out.splitlines()]
    assert pids
    os.kill(proc.pid, signal.SIGTERM)
    proc.wait(timeout=60)
    assert not [pid for pid in pids if alive(pid)] and not pid_file.exists()
