"""sync.transport collective on its NCCL path, driven on CPU: the driver's calls and the versions
they carry, with everything but vLLM's CUDA-only NCCL transfer real.

What stands in for that transfer (it needs GPUs and vLLM's CUDA build): on the learner,
``nccl_api.trainer_group`` and ``nccl_api.send`` (vLLM's trainer side: the communicator and the
packed broadcast); on the engine, ``engine.llm.collective_rpc`` (vLLM's worker methods
``init_weight_transfer_engine``, ``start_weight_update``, ``update_weights``,
``finish_weight_update``). Each records its calls. ``nccl_api.uses_nccl`` is patched to True, as
a config with GPUs would make it, while the learner itself runs on the CPU (a world-1 DeepSpeed
learner in this process, full weights). Ray's remote calls are made in this process, in order
(``_HereGroup``): the learner's half answers before the engines' halves start, which the
stand-ins allow (they never wait for a peer).

The engine's half must not take the version from the broadcast here (vLLM's transfer carries
none): the driver names it, and after a resume that is the learner's restored version.
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from grpo_dist.cluster.ray_utils import ActorGroup, ClusterError
from grpo_dist.config import config_from_dict
from grpo_dist.sync import nccl_api
from grpo_dist.testing.learner import in_process_port

pytestmark = pytest.mark.usefixtures("in_process_learners")


class _Answer:
    """A call already run in this process: what ``ray.get`` of its ObjectRef would give."""

    def __init__(self, fn, *args, **kwargs):
        try:
            self.value, self.error = fn(*args, **kwargs), None
        except Exception as e:  # raised again by the group's get, as a ClusterError
            self.value, self.error = None, e

    def hex(self) -> str:
        return f"{id(self):x}"


class _Here:
    """An actor handle whose ``method.remote(...)`` runs the plain worker's method at once."""

    def __init__(self, worker):
        self.worker = worker

    def __getattr__(self, name: str):
        fn = getattr(self.worker, name)
        return SimpleNamespace(remote=lambda *a, **k: _Answer(fn, *a, **k))


class _HereGroup(ActorGroup):
    """ActorGroup over ``_Here`` handles: ``get`` turns a failed call into the ClusterError that
    ``ActorGroup.get`` makes of a RayTaskError."""

    def get(self, refs: list[Any], timeout: float | None = None, ranks=None) -> list[Any]:
        for i, ref in enumerate(refs):
            if ref.error is not None:
                rank = ranks[i] if ranks is not None else i
                raise ClusterError(f"{self.role} worker {rank} failed: {type(ref.error).__name__}: {ref.error}",
                                   self.role, rank) from ref.error
        return [ref.value for ref in refs]


class _Rpc:
    """Stands in for vLLM's CUDA-only NCCL weight transfer behind ``collective_rpc``: records
    each worker method called and its arguments."""

    def __init__(self):
        self.calls: list[tuple[str, dict]] = []

    def collective_rpc(self, method: str, timeout: float | None = None, kwargs: dict | None = None):
        self.calls.append((method, dict(kwargs or {})))
        return [None]

    def reset_prefix_cache(self) -> None:
        self.calls.append(("reset_prefix_cache", {}))


class _AsyncRpc(_Rpc):
    async def collective_rpc(self, method: str, timeout: float | None = None, kwargs: dict | None = None):
        return super().collective_rpc(method, timeout, kwargs)

    async def reset_prefix_cache(self) -> None:
        super().reset_prefix_cache()


def _config(model_dir):
    return config_from_dict(dict(
        cluster={"torch_threads": 1}, model={"path": str(model_dir)}, lora={"enabled": False},
        rollout={"backend": "vllm", "prompts_per_step": 2, "group_size": 4, "max_tokens": 8},
        learner={"micro_batch_size": 4}, algo={"beta": 0.0},
        sync={"transport": "collective", "bucket_mb": 0.25, "timeout_s": 30}))


@pytest.fixture
def nccl_standins(monkeypatch):
    """The learner's side of vLLM's NCCL transfer stood in for; what it was asked to send."""
    sent: list[dict] = []
    monkeypatch.setattr(nccl_api, "uses_nccl", lambda cfg: True)
    monkeypatch.setattr(nccl_api, "trainer_group", lambda host, port, world: SimpleNamespace(world=world))
    monkeypatch.setattr(nccl_api, "send", lambda group, named, bucket_bytes: sent.append(
        {"names": [n for n, _ in named], "bucket_bytes": bucket_bytes}))
    return sent


def _engine_worker(cfg, streaming: bool = False):
    """A rollout actor's plain worker whose engine is the ``collective_rpc`` stand-in."""
    if not streaming:
        from grpo_dist.run.workers import RolloutActor

        w = RolloutActor(cfg, rank=0)
        w.engine = SimpleNamespace(llm=_Rpc())
        return w
    from grpo_dist.rollout.async_vllm import AsyncVLLMGenerator
    from grpo_dist.run.workers import StreamingRolloutActor

    class Engine(AsyncVLLMGenerator):  # the real drain-and-reload, over the stand-in
        def __init__(self):
            from collections import Counter

            self.llm, self.version, self._lora, self._inflight = _AsyncRpc(), 0, {}, Counter()
            self._draining, self._cond, self._load_lock = False, None, None

    w = StreamingRolloutActor(cfg, rank=0)
    w.engine = Engine()
    return w


MANIFEST = {"kind": "full", "bucket_bytes": 1024, "entries": [["w", "float32", [4, 4]]]}
TRANSFER = ["init_weight_transfer_engine", "start_weight_update", "update_weights", "finish_weight_update",
            "reset_prefix_cache"]


@pytest.mark.parametrize("streaming", [False, True])
def test_engine_refuses_a_broadcast_without_a_version(tiny_model_dir, nccl_standins, streaming):
    """On the NCCL path the engine cannot read a version from the broadcast: it takes part in the
    transfer (the learner's send completes, nothing waits for it), then refuses with an error that
    says so, not a TypeError; named, the version is the one it serves."""
    w = _engine_worker(_config(tiny_model_dir), streaming)
    loop = asyncio.new_event_loop()  # one loop, as in an async actor: its conditions belong to it

    def call(method, *args):
        out = getattr(w, method)(*args)
        return loop.run_until_complete(out) if streaming else out

    try:
        call("join_weight_group", "127.0.0.1", 1234, 2, 1, 1, MANIFEST)
        with pytest.raises(ValueError, match="no version"):
            call("receive_weights", 1, 1, None)
        assert [c for c, _ in w.engine.llm.calls] == TRANSFER[:4]  # the transfer was received
        assert w.version == 0  # not claimed as any version
        out = call("receive_weights", 2, 1, 7)
        assert out["version"] == 7 == w.version
        assert [c for c, _ in w.engine.llm.calls] == TRANSFER[:4] + TRANSFER[1:]
    finally:
        loop.close()


def test_restore_sends_the_learners_restored_version(tiny_model_dir, nccl_standins):
    """After a resume the driver asks learner rank 0 for the version its restored weights carry
    (a learner restored from a checkpoint of step 3 holds version 3), broadcasts them with it,
    and every engine then serves that version; the sync's version is it too."""
    from grpo_dist.run.workers import LearnerActor
    from grpo_dist.sync.collective import CollectiveSync

    cfg = _config(tiny_model_dir)
    learner = LearnerActor(cfg, rank=0, world_size=1, master_port=in_process_port())
    learner.setup()
    try:
        learner.policy.version = 3  # as load_checkpoint leaves it
        engines = [_engine_worker(cfg) for _ in range(2)]
        L = _HereGroup("learner", [_Here(learner)])
        E = _HereGroup("rollout", [_Here(w) for w in engines])
        sync = CollectiveSync(cfg)
        assert sync.nccl
        sync.setup(L, E)
        assert sync.restore() == 3 == sync.version
        assert [w.version for w in engines] == [3, 3]
        for w in engines:
            assert [c for c, _ in w.engine.llm.calls] == TRANSFER
        assert len(nccl_standins) == 1 and nccl_standins[0]["bucket_bytes"] == int(0.25 * 2**20)
        assert sync.learner_done[-1]["version"] == 3
        learner.policy.version = 4  # a step later: a push names the learner's new version
        assert sync.push(4)["sync/version"] == 4.0 and [w.version for w in engines] == [4, 4]
    finally:
        learner.shutdown()
