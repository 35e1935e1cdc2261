"""Heartbeats: an engine process stopped or gone is reported, a busy actor still answers, a
stopped actor is found hung within ``cluster.heartbeat_timeout_s`` (not the call's timeout)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from grpo_dist.util.proc_health import descendants, problems


def test_a_stopped_exited_or_gone_child_is_reported():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        watched = descendants()
        assert child.pid in watched and problems(watched) == []
        os.kill(child.pid, signal.SIGSTOP)
        deadline = time.monotonic() + 10
        while not problems(watched) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert problems(watched) == [(child.pid, watched[child.pid], "stopped")]
        os.kill(child.pid, signal.SIGCONT)
        time.sleep(0.2)
        assert problems(watched) == []
        os.kill(child.pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while not problems(watched) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert problems(watched) == [(child.pid, watched[child.pid], "exited")]  # a zombie until reaped
        assert child.pid not in descendants()  # a zombie is never recorded as an engine process
        child.wait()
        assert problems(watched) == [(child.pid, watched[child.pid], "gone")]
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()


class Busy:
    """An actor whose engine is one child process; ``work`` holds its main thread (pure Python)."""

    def __init__(self):
        self.child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
        self.engine_pids = descendants()

    def work(self, seconds: float) -> int:
        n, end = 0, time.monotonic() + seconds
        while time.monotonic() < end:
            n += 1
        return n

    def pids(self) -> tuple[int, int]:
        return os.getpid(), self.child.pid

    def close(self) -> None:
        self.child.kill()
        self.child.wait()


class AsyncBusy:
    """An async actor (as ``rollout.streaming`` makes them): its calls run on an event loop."""

    def ready(self) -> bool:
        return True

    async def work(self, seconds: float) -> float:
        import asyncio

        await asyncio.sleep(seconds)
        return seconds


@pytest.mark.slow
def test_heartbeats_of_busy_stopped_and_broken_actors(ray_cluster):
    import ray

    from grpo_dist.cluster.actors import Placed
    from grpo_dist.cluster.placement import ActorSpec
    from grpo_dist.cluster.ray_utils import ActorGroup, ClusterError

    if not ray.is_initialized():
        ray.init(address="local", num_cpus=2, include_dashboard=False)

    class BusyActor(Placed, Busy):
        pass

    g = ActorGroup.create("rollout", BusyActor, [(), ()], spec=ActorSpec(num_cpus=0.1), heartbeat=(0.5, 4.0))
    try:
        (pid0, child0), (pid1, child1) = g.get(g.call("pids"), timeout=60)
        # busy in pure Python for 6 s, past the heartbeat timeout: its heartbeat thread still answers
        t0 = time.monotonic()
        assert g.get([g.actors[0].work.remote(6.0)], ranks=[0])[0] > 0
        assert time.monotonic() - t0 >= 6.0
        # the engine child stopped: reported at the next heartbeat, as hung
        os.kill(child0, signal.SIGSTOP)
        t0 = time.monotonic()
        with pytest.raises(ClusterError, match=rf"^rollout worker 0: engine process .*\(pid {child0}\) stopped$") as e:
            g.get([g.actors[0].work.remote(30.0)], ranks=[0])
        assert e.value.hung and not e.value.dead and time.monotonic() - t0 < 5
        os.kill(child0, signal.SIGKILL)
        with pytest.raises(ClusterError, match=rf"engine process .*\(pid {child0}\) (exited|gone)$") as e:
            g.get([g.actors[0].work.remote(30.0)], ranks=[0])
        assert e.value.dead
        # the actor process itself stopped: no heartbeat for the timeout, reported hung (rank 1)
        os.kill(pid1, signal.SIGSTOP)
        t0 = time.monotonic()
        with pytest.raises(ClusterError, match=r"^rollout worker 1: no heartbeat for \d+ s \(cluster\.heartbeat_"
                                               r"timeout_s 4; its process is stopped or hung\)$") as e:
            g.get([g.actors[1].work.remote(1.0)], ranks=[1], timeout=600)
        took = time.monotonic() - t0
        assert e.value.hung and e.value.rank == 1 and 4.0 <= took < 8, took
        g.replace(1)  # kills the stopped actor (and what is left of its engine)
        assert g.get([g.actors[1].work.remote(0.1)], ranks=[1], timeout=60)[0] > 0

        class AsyncActor(Placed, AsyncBusy):
            pass

        a = ActorGroup.create("rollout", AsyncActor, [()], spec=ActorSpec(num_cpus=0.1), max_concurrency=100,
                              heartbeat=(0.5, 4.0))
        try:
            assert a.get(a.call("ready"), timeout=60) == [True]
            assert a.get(a.call("work", 6.0)) == [6.0]  # past the heartbeat timeout: its heartbeats answered
        finally:
            a.kill()
    finally:
        for pid in (child0, child1):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        g.kill()


class StopsInPublish:
    """A learner rank that stops (SIGSTOP, as a hung process would) while it makes a weight update."""

    def publish_update(self):
        os.kill(os.getpid(), signal.SIGSTOP)
        return 1, None

    def pid(self) -> int:
        return os.getpid()


class Loads:
    """An engine that loads whatever it is sent."""

    def load_update(self, payload) -> dict:
        return {"version": 1, "bytes": 0, "seconds": 0.0}


def sync_parties(learner_cls: type, learner_args: list[tuple], heartbeat=None):
    """Ray groups for a ``WeightSync``: learner ranks of ``learner_cls`` (constructor arguments
    ``learner_args``, one tuple a rank) and one engine that loads whatever it is sent."""
    import ray

    from grpo_dist.cluster.actors import Placed
    from grpo_dist.cluster.placement import ActorSpec
    from grpo_dist.cluster.ray_utils import ActorGroup

    if not ray.is_initialized():
        ray.init(address="local", num_cpus=2, include_dashboard=False)
    learner, engine = type("Learner", (Placed, learner_cls), {}), type("Engine", (Placed, Loads), {})
    return (ActorGroup.create("learner", learner, learner_args, spec=ActorSpec(num_cpus=0.1), heartbeat=heartbeat),
            ActorGroup.create("rollout", engine, [()], spec=ActorSpec(num_cpus=0.1), heartbeat=heartbeat))


@pytest.mark.slow
def test_a_learner_stopped_while_it_publishes_is_named_not_the_engines_waiting_for_it(ray_cluster):
    """An engine's load waits for the learner's payload; sent before the payload exists, it would
    queue every later call to that engine (its heartbeat too) behind the stopped learner, and the
    engine would be blamed (and replaced, and blamed again) instead of the learner."""
    from grpo_dist.cluster.ray_utils import ClusterError
    from grpo_dist.sync.weight_sync import WeightSync

    learners, engines = sync_parties(StopsInPublish, [()], heartbeat=(0.5, 3.0))
    try:
        pid = learners.get(learners.call("pid"), timeout=60)[0]
        engines.get(engines.call("node_info"), timeout=60)
        sync = WeightSync()
        sync.setup(learners, engines)
        with pytest.raises(ClusterError, match=r"^learner worker 0: no heartbeat for ") as e:
            sync.push(1)
        assert e.value.role == "learner" and e.value.hung
    finally:
        try:
            os.kill(pid, signal.SIGKILL)
        except (OSError, NameError):
            pass
        learners.kill()
        engines.kill()


def test_engine_processes_are_recorded_while_the_engine_starts():
    """StartWatch: a child titled VLLM::... is recorded (for the heartbeat) as soon as it appears,
    before the start returns; another child is not; once killed it is reported lost."""
    from grpo_dist.util.proc_health import StartWatch

    class Owner:
        engine_pids: dict = {}

    owner = Owner()
    code = "import setproctitle, sys, time; setproctitle.setproctitle(sys.argv[1]); time.sleep(120)"
    kids = [subprocess.Popen([sys.executable, "-c", code, title]) for title in ("VLLM::EngineCore", "g++ helper")]
    try:
        with StartWatch(owner, every=0.1) as watch:
            deadline = time.monotonic() + 20
            while kids[0].pid not in owner.engine_pids and time.monotonic() < deadline:
                time.sleep(0.05)
            assert list(owner.engine_pids) == [kids[0].pid] and watch.lost() == []
            os.kill(kids[0].pid, signal.SIGKILL)
            kids[0].wait()
            assert watch.lost() == [(kids[0].pid, owner.engine_pids[kids[0].pid], "gone")]
    finally:
        for k in kids:
            k.kill()
            k.wait()


class Peer:
    """A rank of a pretend process group: ``step`` waits for its peer (rank 1 sleeps, rank 0 raises
    as gloo does when the peer's connection resets)."""

    def __init__(self, rank: int):
        self.rank = rank

    def pid(self) -> int:
        return os.getpid()

    def step(self, fail_after: float) -> int:
        time.sleep(fail_after if self.rank == 0 else 60)
        raise RuntimeError("[gloo/transport/tcp/pair.cc:537] Read error [10.0.0.2]:4015: Connection reset by peer")


@pytest.mark.slow
def test_a_rank_failing_on_a_lost_peer_names_the_peer(ray_cluster):
    """Rank 1 unreachable (its process stopped, as a node whose link went down) while rank 0 waits on
    it: rank 0 raises first, with a connection error naming only an address; the wait names rank
    1. With rank 1 alive, rank 0's own error is reported."""
    import ray

    from grpo_dist.cluster.actors import Placed
    from grpo_dist.cluster.placement import ActorSpec
    from grpo_dist.cluster.ray_utils import ActorGroup, ClusterError

    if not ray.is_initialized():
        ray.init(address="local", num_cpus=2, include_dashboard=False)

    class Rank(Placed, Peer):
        pass

    g = ActorGroup.create("learner", Rank, [(0,), (1,)], spec=ActorSpec(num_cpus=0.1), heartbeat=(0.5, 6.0))
    try:
        pids = g.get(g.call("pid"), timeout=60)
        with pytest.raises(ClusterError, match=r"^learner worker 0 failed: RuntimeError: \[gloo") as e:
            g.get(g.call("step", 1.0))
        assert e.value.rank == 0
        # a node whose link is down: rank 1 neither answers nor is reported dead before rank 0 raises
        refs = g.call("step", 3.0)
        os.kill(pids[1], signal.SIGSTOP)
        t0 = time.monotonic()
        with pytest.raises(ClusterError, match=r"^learner worker 1: no heartbeat for \d+ s \(cluster\.heartbeat_"
                                               r"timeout_s 6; learner worker 0 failed on it: RuntimeError: \[gloo") as e:
            g.get(refs)
        assert e.value.rank == 1 and e.value.hung
        assert time.monotonic() - t0 >= 5.5  # silent for heartbeat_timeout_s, not for a fixed 5 s
        os.kill(pids[1], signal.SIGKILL)
    finally:
        g.kill()


class Busy2(Peer):
    """A rollout or reward actor: ``work`` raises on rank 0 (a bug), keeps rank 1 busy."""

    def work(self, fail_after: float) -> int:
        time.sleep(fail_after if self.rank == 0 else 30)
        if self.rank == 0:
            raise ValueError("bad prompt")
        return 1


@pytest.mark.slow
@pytest.mark.parametrize("role", ["rollout", "reward"])
def test_a_busy_peer_of_a_raising_actor_is_not_replaced(ray_cluster, role):
    """Issue 42 B2: rank 0 raises while rank 1 is alive but answers its heartbeat late (its process
    paused 7 s: a loaded machine, a long call holding the GIL). Rank 1 is not called hung before
    cluster.heartbeat_timeout_s, so rank 0's own error is reported and Recovery replaces nobody."""
    import threading

    import ray

    from grpo_dist.cluster.actors import Placed
    from grpo_dist.cluster.placement import ActorSpec
    from grpo_dist.cluster.ray_utils import ActorGroup, ClusterError
    from grpo_dist.cluster.recovery import Recovery
    from grpo_dist.config import config_from_dict

    if not ray.is_initialized():
        ray.init(address="local", num_cpus=2, include_dashboard=False)

    class Rank(Placed, Busy2):
        pass

    g = ActorGroup.create(role, Rank, [(0,), (1,)], spec=ActorSpec(num_cpus=0.1), heartbeat=(0.5, 20.0))
    try:
        pids = g.get(g.call("pid"), timeout=60)
        refs = g.call("work", 1.0)
        os.kill(pids[1], signal.SIGSTOP)
        resume = threading.Timer(7.0, _signal, (pids[1], signal.SIGCONT))
        resume.start()
        t0 = time.monotonic()
        with pytest.raises(ClusterError, match=rf"^{role} worker 0 failed: ValueError: bad prompt$") as e:
            g.get(refs)
        assert 6.5 <= time.monotonic() - t0 < 19, time.monotonic() - t0  # waited for rank 1's answer
        assert e.value.rank == 0 and not e.value.hung and not e.value.dead
        rec = Recovery(config_from_dict({}), None)
        with pytest.raises(ClusterError) as again:
            rec.handle(e.value)
        assert again.value is e.value and rec.restarts == 0
        resume.join()
    finally:
        _signal(pids[1], signal.SIGCONT)
        g.kill()


class Stuck:
    """A rollout worker whose engine call stops moving (its heartbeat thread still answers)."""

    since = None

    def work(self, seconds: float) -> int:
        self.since = time.monotonic()
        time.sleep(seconds)
        self.since = None
        return 1

    def engine_stalled_s(self) -> float:
        return 0.0 if self.since is None else time.monotonic() - self.since


@pytest.mark.slow
def test_an_engine_call_without_progress_is_hung_though_the_heartbeat_answers(ray_cluster):
    """Issue 42 item 2: an engine stuck inside a call left the run silent (the actor busy, its
    heartbeat answering); its ``stalled_s`` past cluster.heartbeat_timeout_s makes it hung (replaced)."""
    import ray

    from grpo_dist.cluster.actors import Placed
    from grpo_dist.cluster.placement import ActorSpec
    from grpo_dist.cluster.ray_utils import ActorGroup, ClusterError

    if not ray.is_initialized():
        ray.init(address="local", num_cpus=2, include_dashboard=False)

    from grpo_dist.cluster import ray_utils

    class StuckActor(Placed, Stuck):
        pass

    g = ActorGroup.create("rollout", StuckActor, [()], spec=ActorSpec(num_cpus=0.1), heartbeat=(0.5, 3.0))
    try:
        assert g.get([g.actors[0].work.remote(0.1)], ranks=[0]) == [1]
        t0 = time.monotonic()
        with pytest.raises(ClusterError, match=r"^rollout worker 0: its engine call made no progress for \d+ s "
                                               r"\(cluster\.heartbeat_timeout_s 3; the actor answers, the engine "
                                               r"is stuck\)$") as e:
            g.get([g.actors[0].work.remote(60.0)], ranks=[0], timeout=600)
        assert e.value.hung and not e.value.dead and not e.value.interrupted and 3.0 <= time.monotonic() - t0 < 8
        # after a stop request (the first Ctrl-C) the wait gives up after STOP_GRACE_S (10 s), not the timeout
        g.replace(0)
        g.heartbeat_timeout_s = 600.0
        assert g.get([g.actors[0].work.remote(0.1)], ranks=[0], timeout=60) == [1]
        ray_utils.request_stop()
        try:
            t0 = time.monotonic()
            with pytest.raises(ClusterError, match=r"^rollout worker 0: its engine call made no progress") as e:
                g.get([g.actors[0].work.remote(60.0)], ranks=[0], timeout=600)
            assert e.value.interrupted and 10.0 <= time.monotonic() - t0 < 16
        finally:
            ray_utils.request_stop(False)
    finally:
        g.kill()


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except OSError:  # gone already
        pass


def test_an_engine_start_killed_by_a_signal_is_told_from_one_that_failed_on_its_own():
    """vLLM's start error names each core process's exit code: positive (it raised: a config it
    refuses) stops the run; negative (a signal: the OOM killer, a user) or not yet known (``{}``)
    means the engine is replaced."""
    from grpo_dist.util.proc_health import exited_on_its_own

    def failed(codes: str) -> RuntimeError:
        try:
            raise RuntimeError(f"Engine core initialization failed. See root cause above. Failed core proc(s): {codes}")
        except RuntimeError as inner:
            try:
                raise ValueError("wrapped") from inner
            except ValueError as outer:
                return outer

    assert exited_on_its_own(failed("{'EngineCore': 1}")) and exited_on_its_own(failed("{'EngineCore_DP0': 1}"))
    assert not exited_on_its_own(failed("{'EngineCore': -9}")) and not exited_on_its_own(failed("{}"))
    assert not exited_on_its_own(RuntimeError("CUDA out of memory"))


class HelperEngine:
    """An engine whose start leaves two children: its engine process (titled ``VLLM::EngineCore``, as
    vLLM titles its own) and a helper of the start (a compiler's worker, say) that exits normally
    later, when its stdin closes."""

    def __init__(self):
        code = "import setproctitle, sys, time; setproctitle.setproctitle(sys.argv[1]); time.sleep(120)"
        self.core = subprocess.Popen([sys.executable, "-c", code, "VLLM::EngineCore"])
        self.helper = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"],
                                       stdin=subprocess.PIPE)
        deadline = time.monotonic() + 20
        while descendants().get(self.core.pid, "").startswith("VLLM::") is False and time.monotonic() < deadline:
            time.sleep(0.05)  # the start returns once its engine process is up (titled)

    def close(self) -> None:
        for p in (self.core, self.helper):
            if p.poll() is None:
                p.kill()
            p.wait()


def test_a_helper_child_that_exits_normally_is_not_an_engine_process_lost(tiny_model_dir, tmp_path):
    """Issue 42, B4: once the engine is up, ``RolloutWorker.setup`` records the engine's processes
    for the heartbeat. A helper child that exits normally afterwards is not "engine process gone"
    (it was recorded as the engine's, and the engine replaced); the engine's own process gone is."""
    from grpo_dist.config import config_from_dict
    from grpo_dist.rollout.worker import RolloutWorker

    class Worker(RolloutWorker):
        def _make_engine(self, seed):
            return HelperEngine()

    w = Worker(config_from_dict({"model": {"path": str(tiny_model_dir)}, "sync": {"tmp_dir": str(tmp_path)}}))
    w.setup()
    try:
        core, helper = w.engine.core, w.engine.helper
        assert helper.poll() is None  # alive when the worker recorded its engine's processes
        assert w.engine_pids == {core.pid: descendants()[core.pid]}
        helper.stdin.close()  # its work done: it exits 0
        assert helper.wait(timeout=20) == 0
        assert problems(w.engine_pids) == []
        os.kill(core.pid, signal.SIGKILL)
        core.wait()
        assert problems(w.engine_pids) == [(core.pid, w.engine_pids[core.pid], "gone")]
    finally:
        w.close()


class PublishesVersion:
    """A learner rank whose weight update says version ``version`` (a rank that missed an update:
    a bookkeeping bug the sync must name, not hand on)."""

    def __init__(self, version: int):
        self.version = version

    def publish_update(self):
        return self.version, None


@pytest.mark.slow
def test_a_learner_rank_at_another_version_than_pushed_is_named(ray_cluster):
    """``WeightSync._learner_half(version)`` (issue 42, minor: it ignored the version): every
    learner rank must publish the version the driver pushes (on a restore, the same one); a rank
    that does not stops the push with one line naming it, before any engine is sent a load."""
    from grpo_dist.cluster.ray_utils import ClusterError
    from grpo_dist.sync.weight_sync import WeightSync

    learners, engines = sync_parties(PublishesVersion, [(1,), (2,)])
    try:
        sync = WeightSync()
        sync.setup(learners, engines)
        with pytest.raises(ClusterError, match=r"^weight sync: learner rank 1 published version 2, not the "
                                               r"version 1 pushed$") as e:
            sync.push(1)
        assert (e.value.role, e.value.rank, e.value.dead, e.value.hung) == ("learner", 1, False, False)
        assert sync.loads == [] and sync.version == 0
        with pytest.raises(ClusterError, match=r"^weight sync: learner rank 1 published version 2, not the "
                                               r"version 1 of rank 0$"):
            sync.restore()
    finally:
        learners.kill()
        engines.kill()
