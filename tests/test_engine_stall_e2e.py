"""Issue 52 item 4 on the real stack: a rollout actor (Ray) with its vLLM CPU engine in its process,
heartbeats every 0.5 s, hung after 5 s. One engine step made 15 s longer, computing on the
engine's thread (a long prefill on shared cores), completes and the actor is not taken for hung,
on a second call as on a first; a step blocked as long without CPU (a deadlock) is a stuck engine
although its heartbeat answers; a SIGSTOPped actor (and with it its engine) is hung. The logic
itself, with a fake clock: test_engine_progress.py."""

from __future__ import annotations

import os
import signal
import time

import pytest

from grpo_dist.config import load_config
from grpo_dist.data import make_task

pytestmark = pytest.mark.slow
TIMEOUT = 5.0
LONG = 3 * TIMEOUT


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except OSError:  # gone already
        pass


def test_a_long_step_is_not_a_hang_a_blocked_or_stopped_engine_is(ray_cluster, tiny_model_dir):
    import ray

    from grpo_dist.cluster.placement import actor_specs
    from grpo_dist.cluster.ray_utils import ActorGroup, ClusterError, init_ray
    from grpo_dist.run.workers import RolloutActor
    from grpo_dist.testing.rollout import slow_next_step

    cfg = load_config(None, {"model": {"path": str(tiny_model_dir)}, "lora": {"enabled": False},
                             "rollout": {"backend": "vllm", "group_size": 2, "max_tokens": 4},
                             "cluster": {"num_cpus": 2}})
    assert cfg.rollout.engine_in_process in (None, True)  # the CPU default: the engine in the actor
    init_ray(cfg)
    g = ActorGroup.create("rollout", RolloutActor, [(cfg, 0)], spec=actor_specs(cfg)["rollout"],
                          heartbeat=(0.5, 120.0))  # a start on loaded cores may starve a heartbeat
    pid = None
    try:
        actor = g.actors[0]
        g.get([actor.setup.remote()], timeout=600)
        pid = g.get([actor.node_info.remote()])[0]["pid"]
        g.heartbeat_timeout_s = TIMEOUT
        recs = make_task("add", 2, seed=5, split="eval")
        keys = [(0, 1, 0), (0, 1, 1)]

        def generate(timeout: float = 300):
            return g.get([actor.generate.remote(recs, keys=keys)], ranks=[0], timeout=timeout)[0]

        first = generate()  # the engine has ticked in a call before
        # a step computing 3x the timeout on the engine's thread: slow, not hung, not replaced
        ray.get(actor.debug_call.remote(slow_next_step, LONG, True))
        t0 = time.monotonic()
        again = generate()
        assert time.monotonic() - t0 >= LONG
        assert [r.completion_ids for gr in again for r in gr.rollouts] == \
               [r.completion_ids for gr in first for r in gr.rollouts]  # the same keys, the same tokens
        # a step blocked as long, using no CPU: stuck, though the actor's heartbeat answers
        ray.get(actor.debug_call.remote(slow_next_step, LONG, False))
        t0 = time.monotonic()
        with pytest.raises(ClusterError, match=r"^rollout worker 0: its engine call made no progress for \d+ s "
                                               r"\(cluster\.heartbeat_timeout_s 5; ") as e:
            generate()
        assert e.value.hung and not e.value.dead and TIMEOUT <= time.monotonic() - t0 < LONG, time.monotonic() - t0
        # the actor stopped (the engine with it: SIGSTOP stops every thread): no heartbeat
        _signal(pid, signal.SIGSTOP)
        t0 = time.monotonic()
        with pytest.raises(ClusterError, match=r"^rollout worker 0: no heartbeat for \d+ s") as e:
            generate()
        assert e.value.hung and TIMEOUT <= time.monotonic() - t0 < TIMEOUT + 10, time.monotonic() - t0
    finally:
        if pid is not None:
            _signal(pid, signal.SIGCONT)
        g.kill()
