"""A driver killed with SIGKILL leaves no process of the local Ray cluster it started."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from grpo_dist.cluster.reaper import _alive, descendants, ray_processes, reap


def _spawn_driver(code: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(code)], stdout=subprocess.PIPE, text=True,
                            start_new_session=True)


def test_reap_stops_the_recorded_processes_once_the_driver_is_gone():
    """No Ray: a 'driver' with a child that ignores its parent's death; reap() waits for the
    driver, then stops the child (and only processes recorded with their start time)."""
    drv = _spawn_driver("""
        import subprocess, sys, time
        subprocess.Popen(["sleep", "300"])
        print("ready", flush=True)
        time.sleep(300)
    """)
    assert drv.stdout.readline().strip() == "ready"
    procs = descendants(drv.pid)
    assert len(procs) == 1 and all(_alive(p) for p in procs)
    from grpo_dist.cluster.reaper import _stat

    driver = (drv.pid, _stat(drv.pid)[1])
    os.kill(drv.pid, signal.SIGKILL)
    drv.wait()
    assert reap(driver, procs + [(procs[0][0], procs[0][1] + 1)], poll_s=0.05, grace_s=2.0) == 1
    assert not any(_alive(p) for p in procs)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_sigkilled_driver_leaves_no_local_cluster_process_after_30_s():
    drv = _spawn_driver("""
        import time
        from grpo_dist.config import load_config
        from grpo_dist.cluster.ray_utils import init_ray
        init_ray(load_config(None, {"cluster": {"num_cpus": 2}}))
        import ray
        @ray.remote
        def f():
            return 1
        ray.get(f.remote())
        print("ready", flush=True)
        time.sleep(300)
    """)
    try:
        assert drv.stdout.readline().strip() == "ready"
        time.sleep(2)
        procs = ray_processes(drv.pid)
        names = {open(f"/proc/{p}/cmdline", "rb").read().split(b"\0")[0].decode() for p, _ in procs if _alive((p, _))}
        assert any("raylet" in n for n in names) and any("DashboardAgent" in n or "dashboard" in n for n in names)
        os.kill(drv.pid, signal.SIGKILL)
        drv.wait()
        deadline = time.time() + 30
        while time.time() < deadline and any(_alive(p) for p in procs):
            time.sleep(1)
        left = [p for p in procs if _alive(p)]
        assert not left, [open(f"/proc/{p}/cmdline", "rb").read()[:80] for p, _ in left]
    finally:
        if drv.poll() is None:
            drv.kill()
