"""cluster.node_loss: before a silent actor is replaced, its node is probed; a node that does not
answer (its raylet stopped here, as a link down would leave it) is waited on until Ray marks it
dead, so that the replacement is placed elsewhere. Two Ray nodes on this machine
(``ray.cluster_utils.Cluster``) with a fast health check."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

pytestmark = pytest.mark.slow

FAST_HEALTH_CHECK = {"health_check_initial_delay_ms": 0, "health_check_period_ms": 500,
                     "health_check_timeout_ms": 500, "health_check_failure_threshold": 4}


@pytest.fixture(scope="module")
def cluster():
    import ray
    from ray.cluster_utils import Cluster

    from grpo_dist.cluster.ray_utils import shutdown_ray
    from grpo_dist.util.ports import free_port

    shutdown_ray()

    def ports():
        return {"dashboard_agent_listen_port": free_port(), "metrics_export_port": free_port()}

    c = Cluster(initialize_head=True, connect=True,
                head_node_args={"num_cpus": 1, "_system_config": FAST_HEALTH_CHECK, **ports()})
    c.far = c.add_node(num_cpus=1, resources={"far": 1}, **ports())
    c.wait_for_nodes()
    yield c
    ray.shutdown()
    c.shutdown()


class Idle:
    def node(self) -> str:
        import ray

        return ray.get_runtime_context().get_node_id()


def test_an_answering_node_is_not_waited_on(cluster):
    import ray

    from grpo_dist.cluster.node_loss import await_lost_node, node_of

    a = ray.remote(num_cpus=0)(Idle).remote()
    node = ray.get(a.node.remote())
    assert node_of(a) == node
    t0 = time.monotonic()
    assert await_lost_node(a, "idle actor") == "alive"
    assert time.monotonic() - t0 < 10


def test_a_node_that_stopped_answering_is_waited_on_until_ray_marks_it_dead(cluster, caplog):
    import ray

    from grpo_dist.cluster import ray_utils
    from grpo_dist.cluster.node_loss import await_lost_node

    a = ray.remote(num_cpus=0, resources={"far": 1})(Idle).remote()
    node = ray.get(a.node.remote())
    assert node == cluster.far.node_id
    raylet = cluster.far.all_processes["raylet"][0].process
    os.kill(raylet.pid, signal.SIGSTOP)  # its actor lives on, unreachable: a link down
    try:
        # a stop request (the first Ctrl-C) while it waits: answered within a second (issue 42 B3)
        stop = threading.Timer(0.2, ray_utils.request_stop)
        stop.start()
        t0 = time.monotonic()
        try:
            assert await_lost_node(a, "rollout worker 0", probe_s=3, wait_s=60) == "stopped"
        finally:
            stop.join()
            ray_utils.request_stop(False)
        assert time.monotonic() - t0 < 1.5
        t0 = time.monotonic()
        with caplog.at_level("WARNING", logger="grpo_dist.cluster"):
            verdict = await_lost_node(a, "rollout worker 0", probe_s=3, wait_s=60)
        took = time.monotonic() - t0
        assert verdict == "dead" and 3 <= took < 60, (verdict, took)
        assert "does not answer either: waiting for Ray to mark it dead" in caplog.text
        assert not any(n["Alive"] for n in ray.nodes() if n["NodeID"] == node)
        assert await_lost_node(a, "rollout worker 0") == "dead"  # known dead: no probe, no wait
    finally:
        os.kill(raylet.pid, signal.SIGKILL)
        os.kill(raylet.pid, signal.SIGCONT)
