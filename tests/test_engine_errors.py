"""Issue 42 item 2: never silent after an error inside an engine call. An engine call that raised
fails its worker call (the chunk) with the engine's own error, on every batch path: the plain
generate, an environment's turns (rollout/turns.py), a user rollout function and an agent
(both through ``user_fn._Batcher``; the agent's case runs on vLLM in tests/test_agent_endpoint.py),
and the streaming loop (rollout/turns_async.py). The driver then replaces the engine (a dead
one, ``EngineDeadError``) or stops with one line (``rollout worker 0 failed: ...``). In-process
rollout workers, transformers backend, the demo's base model; the fault is injected by
replacing the engine's ``generate`` attribute (``grpo_dist.testing.rollout.fail_engine_calls``)."""

from __future__ import annotations

import asyncio
import time

import pytest

from grpo_dist.config import load_config
from grpo_dist.data import make_task
from grpo_dist.testing.rollout import EngineCallFailed, fail_engine_calls, hf_worker as _worker

HELPERS = "tests/env_helpers.py"


@pytest.mark.parametrize("rollout", [
    {},
    {"env": "grpo_dist.testing.envs:TwoTurns"},
    {"rollout_fn": f"{HELPERS}:two_calls"},
    {"rollout_fn": f"{HELPERS}:swallows_errors"},
], ids=["plain", "env", "rollout_fn", "rollout_fn_swallowing"])
def test_an_engine_error_fails_the_call_with_it(pretrained_model_dir, rollout):
    from pathlib import Path

    if "rollout_fn" in rollout:
        rollout["rollout_fn"] = str(Path(__file__).parent / rollout["rollout_fn"].split("/")[-1])
    w = _worker(pretrained_model_dir, **rollout)
    recs = make_task("add", 3, seed=5, split="eval")
    keys = [(0, 1, i) for i in range(3)]
    try:
        fail_engine_calls(w)
        t0 = time.monotonic()
        with pytest.raises(EngineCallFailed, match=r"^Check failed: thread_num == thread_num \(1 vs. 2\)$"):
            w.generate(recs, keys=keys)
        assert time.monotonic() - t0 < 30 and w.engine.failed_calls == 1  # the engine was not called again
        groups = w.generate(recs, keys=keys)  # the next call generates
        assert [len(g.rollouts) for g in groups] == [2, 2, 2]
    finally:
        w.close()


class _Tok:
    def decode(self, ids, skip_special_tokens=False):
        return ""


class FailingAsyncEngine:
    """An async engine whose first request raises and whose others hang (a broken engine): the
    fault injected into the streaming loop (rollout/turns_async.py)."""

    tokenizer = _Tok()
    version = 0

    def __init__(self):
        self.calls, self.cancelled = 0, 0

    async def generate_group(self, ids, spec, seeds, min_version=0):
        self.calls += 1
        if self.calls == 1:
            await asyncio.sleep(0.05)
            raise EngineCallFailed("engine step failed")
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            self.cancelled += 1
            raise


def test_an_engine_error_in_the_streaming_loop_fails_the_group_and_ends_its_siblings():
    from grpo_dist.envs.registry import EnvSource
    from grpo_dist.rollout.base import SamplingSpec
    from grpo_dist.rollout.turns_async import run_group_async
    from grpo_dist.types import PromptRecord

    cfg = load_config(None, {"rollout": {"group_size": 4}})
    source = EnvSource.from_config(cfg.rollout.model_copy(update={"env": "grpo_dist.testing.envs:TwoTurns"}))
    engine = FailingAsyncEngine()

    async def go():
        try:
            await asyncio.wait_for(run_group_async(engine, PromptRecord(0, "q"), [1, 2, 3], SamplingSpec(n=4),
                                                   None, source, 64), 10)
        except EngineCallFailed as e:
            await asyncio.sleep(0.1)  # (before asyncio.run cancels whatever is left)
            return e, engine.cancelled
        return None, engine.cancelled

    err, cancelled = asyncio.run(go())
    assert isinstance(err, EngineCallFailed) and str(err) == "engine step failed"
    assert engine.calls == 4 and cancelled == 3  # no trajectory left waiting on the broken engine


def test_an_engine_call_that_does_not_move_is_reported_stalled(pretrained_model_dir):
    """The heartbeat's ``stalled_s`` (issue 42 item 2): seconds the engine's call in flight has not
    moved. A transformers decode ticks each step, so a healthy call stays near 0; a call stuck in
    the engine (``hang_next_generate``) grows until it returns. The driver's side (hung past
    cluster.heartbeat_timeout_s although the heartbeat answers): tests/test_heartbeat.py."""
    import threading

    from grpo_dist.rollout.base import progress_of
    from grpo_dist.testing.rollout import hang_next_generate

    w = _worker(pretrained_model_dir, max_tokens=16)
    recs = make_task("add", 2, seed=5, split="eval")
    try:
        seen: list[float] = []
        engine_progress = progress_of(w.engine)
        ticks = []
        tick = engine_progress.tick
        engine_progress.tick = lambda: (ticks.append(1), tick())[1]
        w.generate(recs, keys=[(0, 1, 0), (0, 1, 1)])
        assert len(ticks) >= 3 and w.engine_stalled_s() == 0.0  # each decode step moved it; idle now
        hang_next_generate(w, 3.0)
        t = threading.Thread(target=w.generate, args=(recs,), kwargs={"keys": [(0, 1, 0), (0, 1, 1)]})
        t.start()
        while t.is_alive():
            seen.append(w.engine_stalled_s())
            time.sleep(0.2)
        assert max(seen) >= 2.0 and w.engine_stalled_s() == 0.0, seen
    finally:
        w.close()


def test_an_engine_that_never_ticks_is_never_reported_stalled():
    """An engine whose calls cannot say they move (a vLLM whose generate loop does not go through
    ``llm_engine.step``, the streaming engine) must not be taken for a stuck one on a long call."""
    from grpo_dist.rollout.base import EngineProgress

    p = EngineProgress()
    with p.call():
        time.sleep(0.3)
        assert p.stalled_s() == 0.0
    with p.call():
        p.tick()  # it moved once inside a call: from now on its silence counts
        time.sleep(0.3)
        assert p.stalled_s() >= 0.25
    assert p.stalled_s() == 0.0
