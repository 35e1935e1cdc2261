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
