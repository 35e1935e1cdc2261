"""Fault injection for rollout-worker tests (importable by Ray actors, unlike test modules).

Pass these to a Ray rollout actor through its one hook: ``actor.debug_call.remote(fn, *args)``.
Nothing here is used in training.
"""

from __future__ import annotations

import time


def hang_next_generate(worker, seconds: float) -> None:
    """The worker's next engine ``generate`` call stalls ``seconds`` first (a hung engine)."""
    engine = worker.engine
    generate = engine.generate

    def stalled(*args, **kwargs):
        engine.generate = generate  # only this call hangs
        time.sleep(seconds)
        return generate(*args, **kwargs)

    engine.generate = stalled


def slow_next_step(worker, seconds: float, busy: bool = True) -> None:
    """The next step of the worker's vLLM engine takes ``seconds`` longer, on the engine's own
    thread, before the step (and its progress tick) ends: computing (``busy``: a long prefill on
    shared cores) or blocked without using CPU (a deadlock)."""
    engine = worker.engine.llm.llm_engine
    step = engine.step  # the instance's: it ticks the engine's progress after each step

    def slow(*args, **kwargs):
        engine.step = step  # only this step
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            if not busy:
                time.sleep(max(0.0, end - time.monotonic()))
        return step(*args, **kwargs)

    engine.step = slow


def die_in_next_receive(worker) -> None:
    """The worker's next weight receive (``sync.transport: collective``) ends its process as it
    starts: learner rank 0 is then broadcasting to an engine that is gone. (Ray calls an actor's
    methods from its class, so the engine's RPC is what is patched.)"""
    llm = worker.engine.llm
    rpc = llm.collective_rpc

    def dying(method, *args, **kwargs):
        if method == "grpo_receive_weights":
            import os

            os._exit(1)
        return rpc(method, *args, **kwargs)

    llm.collective_rpc = dying


class EngineCallFailed(RuntimeError):
    """The error :func:`fail_engine_calls` injects (its name says whose it is in a test's match)."""


def fail_engine_calls(worker, message: str = "Check failed: thread_num == thread_num (1 vs. 2)",
                      times: int = 1) -> None:
    """The worker's next ``times`` engine ``generate`` calls raise ``EngineCallFailed(message)``
    (as vLLM's CPU attention check did, issue 42); later calls generate again. The calls made
    are counted in ``worker.engine.failed_calls``. Batch engines only (the streaming engine's
    ``generate_group`` is async)."""
    engine = worker.engine
    generate = engine.generate
    engine.failed_calls = 0

    def failing(*args, **kwargs):
        if engine.failed_calls < times:
            engine.failed_calls += 1
            raise EngineCallFailed(message)
        return generate(*args, **kwargs)

    engine.generate = failing


def hf_worker(model_dir, max_tokens: int = 4, **rollout):
    """An in-process rollout worker (transformers backend, full weights, G = 2), set up."""
    from grpo_dist.config import load_config
    from grpo_dist.rollout.worker import RolloutWorker

    cfg = load_config(None, {"model": {"path": str(model_dir)}, "lora": {"enabled": False},
                             "rollout": {"backend": "hf", "group_size": 2, "max_tokens": max_tokens, **rollout}})
    w = RolloutWorker(cfg)
    w.setup()
    return w


def stored_versions(worker) -> tuple[list[int], list[str]]:
    """The versions the worker wrote to its disk cache (``AdapterStore``), and the files there: both
    empty where every version was loaded in place."""
    import os

    return list(worker.store.versions), sorted(os.listdir(worker.store.root))


def receive_over_group(worker, state: dict, bucket_bytes: int = 40_000) -> tuple[dict, object, object]:
    """A rollout worker joins a gloo weight group as rank 1 (its own thread: the caller's) while a
    thread here opens rank 0, then receives ``state`` (full weights, version 5) broadcast bucket by
    bucket. Returns ``(receive_weights' answer, the manifest, the group)``; close the group after."""
    import threading

    from grpo_dist.sync.buckets import WeightGroup, make_manifest, pack, plan, send_header
    from grpo_dist.util.ports import free_port

    manifest = make_manifest(state.items(), kind="full", bucket_bytes=bucket_bytes)
    port, box = free_port(), {}
    opener = threading.Thread(target=lambda: box.setdefault(
        "group", WeightGroup("127.0.0.1", port, 0, 2, 60, tag="1", bind_ip="127.0.0.1")))
    opener.start()
    worker.join_weight_group("127.0.0.1", port, 2, 1, 1, manifest)
    opener.join()
    group = box["group"]

    def send():
        send_header(group, [1, 1, 5, len(plan(manifest))])
        for b in pack(manifest, list(state.values())):
            group.broadcast(b)

    sender = threading.Thread(target=send)
    sender.start()
    out = worker.receive_weights(1, 1)
    sender.join()
    return out, manifest, group
