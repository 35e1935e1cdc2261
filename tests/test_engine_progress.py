"""Issue 52 item 4: a slow engine is not a stalled one. ``EngineProgress`` (rollout/base.py) counts
an engine call as moving while the engine's threads or processes use CPU time (1% of a core or
more), not only when a whole engine step ends: one step longer than
``cluster.heartbeat_timeout_s`` (a long prefill on shared CPU cores) that computes is no stall,
on the first call as on any later one; an engine that uses no CPU inside a call (stopped,
blocked in a deadlock) is, counted from its last move.

The logic with a fake clock and CPU reading; then the readings themselves, of a real thread and
a real process, running, blocked and stopped. A real engine under Ray: test_engine_stall_e2e.py.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

from grpo_dist.rollout.base import EngineProgress


class Clock:
    def __init__(self):
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_a_step_that_computes_past_the_timeout_is_no_stall_one_that_stops_is():
    clock, cpu = Clock(), {"engine": 1.0}
    p = EngineProgress(clock=clock, cpu=lambda: dict(cpu))
    with p.call():  # a first call, ticked once per step
        clock.t += 1
        cpu["engine"] += 0.5
        p.tick()
    clock.t += 50
    cpu["engine"] += 3.0  # busy-polling while idle: no call, nothing judged
    assert p.stalled_s() == 0.0
    with p.call():  # the second call: its first step (a long prefill) takes 100 s, computing
        for _ in range(20):
            clock.t += 5
            cpu["engine"] += 2.0
            assert p.stalled_s() == 0.0
        for k in range(1, 4):  # then it stops (SIGSTOP, a deadlock): no CPU from now on
            clock.t += 5
            assert p.stalled_s() == 5.0 * k
        cpu["engine"] += 0.01  # one clock tick in 15 s (a helper thread woke): under 1% of a core, no move
        assert p.stalled_s() == 15.0
        clock.t += 5
        cpu["engine"] += 0.5  # it computes again
        assert p.stalled_s() == 0.0
        clock.t += 7
        p.tick()  # a step ended
        assert p.stalled_s() == 0.0
    clock.t += 60
    assert p.stalled_s() == 0.0  # idle


def test_a_call_that_never_uses_cpu_is_stalled_from_its_start():
    """An engine whose CPU is known is judged from the call's start: one blocked before its first
    step is found; CPU it used before the call (idle polling) is no progress of the call."""
    clock, cpu = Clock(), {"engine": 1.0}
    p = EngineProgress(clock=clock, cpu=lambda: dict(cpu))
    cpu["engine"] += 5.0
    with p.call():
        clock.t += 30  # no heartbeat asked meanwhile: the first look compares with the call's start
        assert p.stalled_s() == 30.0


def test_a_tick_only_engine_is_judged_after_its_first_tick_of_each_call():
    """An engine whose CPU cannot be read (``cpu`` gives nothing) says it moves by ticks alone:
    a call is judged only once it ticked *in that call* (the flag reset per call). Before, it
    stayed set after the first call, so from the second call on a first step longer than the
    timeout (a long prefill) read as a stall."""
    p = EngineProgress()
    with p.call():
        p.tick()
        time.sleep(0.3)
        assert p.stalled_s() >= 0.25  # it ticked in this call: its silence counts
    with p.call():
        time.sleep(0.3)  # the second call's first step, not ended yet
        assert p.stalled_s() == 0.0
        p.tick()
        time.sleep(0.3)
        assert p.stalled_s() >= 0.25
    assert p.stalled_s() == 0.0


def _poll(p: EngineProgress, seconds: float, every: float = 0.1) -> list[float]:
    seen, end = [], time.monotonic() + seconds
    while time.monotonic() < end:
        seen.append(p.stalled_s())
        time.sleep(every)
    return seen


def test_the_calling_threads_cpu_is_progress_of_an_engine_that_runs_on_it():
    """``runs_on_caller`` (the transformers engine): the thread inside the call is the engine's.
    Computing for 2 s without a tick: never stalled; sleeping (blocked) for 2 s: stalled."""
    p = EngineProgress()
    p.runs_on_caller = True

    def call(busy: bool) -> list[float]:
        def work():
            with p.call():
                end = time.monotonic() + 2.0
                while time.monotonic() < end:
                    if not busy:
                        time.sleep(0.05)

        t = threading.Thread(target=work)
        t.start()
        seen = _poll(p, 2.0)
        t.join()
        return seen

    busy, blocked = call(True), call(False)
    assert max(busy) < 1.0, busy  # the heartbeat's looks every 0.1 s each saw CPU used (shared cores: slack)
    assert max(blocked) >= 1.5, blocked
    assert p.stalled_s() == 0.0


def test_an_engine_processs_cpu_is_progress_until_it_is_stopped():
    """``processes`` (an engine core and its workers in processes of their own): a running
    process computing is progress, a SIGSTOPped one is not."""
    child = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        p = EngineProgress()
        p.processes = {child.pid}
        with p.call():
            running = _poll(p, 1.5)
            os.kill(child.pid, signal.SIGSTOP)
            time.sleep(0.1)
            p.stalled_s()  # the last look that may see the CPU it used before it stopped
            stopped = _poll(p, 1.5)
        assert max(running) < 1.0, running
        assert stopped[-1] >= 1.2, stopped
    finally:
        child.kill()
        child.wait()
