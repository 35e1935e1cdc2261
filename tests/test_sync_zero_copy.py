"""Weights without a copy of their own (grpo_dist.sync.zero_copy, the object store's payload,
the collective's bucket prefetch): no Ray, no engine. The engines' in-place loads from these
payloads: tests/test_sync_in_place.py."""

from __future__ import annotations

import multiprocessing as mp
import pickle
import threading
import time

import pytest
import torch

from grpo_dist.sync.buckets import prefetched
from grpo_dist.sync.object_store import ArrayPayload, ObjectStoreTransport
from grpo_dist.sync.zero_copy import ArrayState, rebuild, share
from grpo_dist.types import AdapterUpdate


def _state() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    emb = torch.randn(64, 16, generator=g)
    return {"embed.weight": emb, "lm_head.weight": emb,  # tied: one storage, two names
            "norm.weight": torch.randn(16, generator=g).to(torch.bfloat16),
            "step": torch.tensor(7), "t.weight": torch.randn(16, 8, generator=g).t()}  # not contiguous


def test_object_store_payload_is_views_out_of_band_and_tied_tensors_travel_once():
    state = _state()
    payload = ObjectStoreTransport().publish(AdapterUpdate(3, state, None))
    assert isinstance(payload, ArrayPayload)
    arrays = payload.state.arrays
    # the learner's own memory, no clone (the transposed one is the only copy: made contiguous)
    assert arrays[0].__array_interface__["data"][0] == state["embed.weight"].data_ptr()
    assert arrays[1] == 0 and payload.state.nbytes == 64 * 16 * 4 + 16 * 2 + 8 + 16 * 8 * 4
    # what Ray does with it (pickle 5): the bytes out of band, the pickle itself a few hundred bytes
    buffers: list = []
    blob = pickle.dumps(payload, protocol=5, buffer_callback=buffers.append)
    assert len(blob) < 2000 and sum(memoryview(b).nbytes for b in buffers) == payload.state.nbytes
    store = [bytearray(memoryview(b)) for b in buffers]  # "the object store"
    got = ObjectStoreTransport().receive(pickle.loads(blob, buffers=store))
    assert got.version == 3 and got.peft_config is None and list(got.tensors) == list(state)
    for k, v in state.items():
        assert got.tensors[k].dtype == v.dtype and torch.equal(got.tensors[k], v), k
    # the engine reads views of the store's memory: no private copy per reader
    assert got.tensors["embed.weight"].data_ptr() == ctypes_addr(store[0])
    assert got.tensors["lm_head.weight"].data_ptr() == got.tensors["embed.weight"].data_ptr()


def ctypes_addr(buf: bytearray) -> int:
    import ctypes

    return ctypes.addressof(ctypes.c_char.from_buffer(buf))


def test_array_state_refuses_device_tensors_with_one_line():
    with pytest.raises(ValueError, match="^ArrayState takes CPU tensors; w is on meta$"):
        ArrayState.of({"w": torch.empty(2, device="meta")})


def _child(blob: bytes, q) -> None:
    named = dict(rebuild(blob))
    q.put({k: float(v.double().sum()) for k, v in named.items()})
    named["a"][0] = 42.0  # written in the parent's memory
    q.put("done")


def test_shared_handles_cross_a_process_as_plain_pickle_without_the_payload():
    """What an engine core in its own process gets (vLLM's RPC pickles its arguments): handles,
    not the bytes; the child's tensors are the parent's memory."""
    a, b = torch.arange(100_000, dtype=torch.float32), torch.ones(3, 3, dtype=torch.bfloat16)
    blob = share([("a", a), ("b", b)])
    assert isinstance(blob, bytes) and len(blob) < 4000  # 400 KB of weights: a name per tensor travels, not its bytes
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    p = ctx.Process(target=_child, args=(blob, q))
    p.start()
    try:
        sums = q.get(timeout=120)
        assert q.get(timeout=30) == "done"
    finally:
        p.join(30)
    assert sums["b"] == 9.0 and sums["a"] == float(torch.arange(100_000, dtype=torch.float64).sum())
    assert float(dict(rebuild(blob))["a"][0]) == 42.0  # the child's write is in the shared memory


def test_prefetch_keeps_order_runs_ahead_by_one_and_hands_on_errors():
    produced: list[int] = []

    def items(n, fail_at=None):
        for i in range(n):
            if i == fail_at:
                raise RuntimeError(f"broadcast {i} failed")
            produced.append(i)
            yield i

    got = []
    for x in prefetched(items(5)):
        time.sleep(0.05)  # the consumer loads: the producer is at most one bucket plus the one in hand ahead
        assert len(produced) <= x + 3
        got.append(x)
    assert got == [0, 1, 2, 3, 4]
    with pytest.raises(RuntimeError, match="^broadcast 2 failed$"):
        list(prefetched(items(5, fail_at=2)))
    before, n = threading.active_count(), len(produced)
    it = prefetched(items(1000))
    next(it)
    it.close()  # a consumer that stops early stops the producer
    time.sleep(0.5)
    assert threading.active_count() <= before and len(produced) - n < 10
