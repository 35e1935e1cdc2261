"""sync.transport collective, the parts without Ray or vLLM: the bucket plan both ends compute,
the learner's packing (bounded extra memory), the engine's unpacking, and the gloo group itself
(a member that dies mid-broadcast is an error on the sender at once and a timeout on the others,
never a hang). The end-to-end tests are tests/test_collective_e2e.py."""

from __future__ import annotations

import multiprocessing as mp
import os
import time

import pytest
import torch

from grpo_dist.sync.buckets import (WeightGroup, make_manifest, pack, payload_bytes, plan, receive_header,
                                    send_header, unpack)
from grpo_dist.util.memory import TensorPeak
from grpo_dist.util.ports import free_port


def _state() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {"embed.weight": torch.randn(300, 8, generator=g),  # 9600 B: larger than a bucket, sliced
            "a.weight": torch.randn(7, 5, generator=g),
            "a.bias": torch.randn(7, generator=g),
            "b.weight": torch.randn(16, 16, generator=g).to(torch.bfloat16),
            "steps": torch.arange(11),  # integers travel as they are
            "empty": torch.empty(0)}


def _receive_all(manifest, buckets) -> dict[str, torch.Tensor]:
    sent = iter([b.clone() for b in buckets])
    return {name: t.clone() for done in unpack(manifest, lambda buf: buf.copy_(next(sent))) for name, t in done}


@pytest.mark.parametrize("send_dtype", [None, torch.bfloat16])
def test_buckets_round_trip_within_the_bucket_size(send_dtype):
    state = _state()
    manifest = make_manifest(state.items(), kind="full", bucket_bytes=1024, send_dtype=send_dtype)
    buckets = [b.clone() for b in pack(manifest, list(state.values()))]
    layout = plan(manifest)
    assert len(buckets) == len(layout) >= 6 and all(b.numel() <= 1024 for b in buckets)
    assert [b.numel() for b in buckets] == [n for n, _ in layout]
    assert sum(b.numel() for b in buckets) == payload_bytes(manifest)
    got = _receive_all(manifest, buckets)
    assert list(got) == list(state)
    for name, t in state.items():
        want = t.to(send_dtype) if send_dtype is not None and t.is_floating_point() else t
        assert got[name].dtype == want.dtype and got[name].shape == want.shape
        assert torch.equal(got[name], want), name


def test_one_bucket_when_everything_fits_and_a_slice_travels_without_a_copy():
    state = _state()
    manifest = make_manifest(state.items(), kind="full", bucket_bytes=1 << 20)
    assert len(plan(manifest)) == 1
    big = torch.randn(4096)  # 16 KiB in 4 KiB buckets: slices of its own memory
    m = make_manifest([("big", big)], kind="full", bucket_bytes=4096)
    views = list(pack(m, [big]))
    assert len(views) == 4 and all(v.untyped_storage().data_ptr() == big.untyped_storage().data_ptr() for v in views)


def test_packing_costs_at_most_one_bucket_of_memory():
    """64 tensors of 1 MiB in 4 MiB buckets: the learner's extra peak stays near one bucket, far
    from the 64 MiB a copy of the weights (the payload transports' export) takes. Counted at the
    allocator: the process's high-water mark (PeakMemory) is not kept in CI's sandbox."""
    state = {f"w{i}": torch.randn(256, 1024) for i in range(64)}
    manifest = make_manifest(state.items(), kind="full", bucket_bytes=4 << 20)
    tensors = list(state.values())
    total = 0
    with TensorPeak() as peak:
        for b in pack(manifest, tensors):
            total += int(b[:: 1 << 16].sum())  # read it, as a send would
    with TensorPeak() as copy:
        snapshot = {k: v.clone() for k, v in state.items()}
    del snapshot
    print(f"pack extra peak {peak.extra / 2**20:.1f} MiB, a copy {copy.extra / 2**20:.1f} MiB")
    assert peak.extra is not None and copy.extra is not None
    assert peak.extra <= (4 << 20) + (2 << 20) and copy.extra >= 60 << 20


def _member(rank: int, world: int, port: int, manifest, die_at: int, out) -> None:
    try:
        group = WeightGroup("127.0.0.1", port, rank, world, timeout_s=5.0, tag="t", bind_ip="127.0.0.1",
                            join_timeout_s=120)
        for seq in range(3):
            if seq == die_at:
                import os

                out.close()
                out.join_thread()  # what was put reaches the parent before the exit
                os._exit(1)
            header = receive_header(group, 2)
            got = {n: t.clone() for done in unpack(manifest, group.broadcast) for n, t in done}
            out.put((rank, seq, header, float(sum(t.double().sum() for t in got.values()))))
    except Exception as e:
        out.put((rank, "error", type(e).__name__, str(e)[:200]))


def test_gloo_group_broadcasts_buckets_and_a_dead_member_is_an_error_not_a_hang():
    state = _state()
    manifest = make_manifest(state.items(), kind="full", bucket_bytes=1024)
    want = float(sum(t.double().sum() for t in state.values()))
    ctx = mp.get_context("spawn")
    out, port = ctx.Queue(), free_port()
    procs = [ctx.Process(target=_member, args=(r, 3, port, manifest, 1 if r == 2 else -1, out)) for r in (1, 2)]
    for p in procs:
        p.start()
    group = WeightGroup("127.0.0.1", port, 0, 3, timeout_s=5.0, tag="t", bind_ip="127.0.0.1", join_timeout_s=120)
    send_header(group, [0, 7])
    for b in pack(manifest, list(state.values())):
        group.broadcast(b)
    from cluster_scripts import listening

    # the store and gloo listen on the group's address only (torch's own store: every interface)
    assert {a for a, _, _ in listening({os.getpid()})} == {"127.0.0.1"}
    got = sorted((out.get(timeout=30)[:4] for _ in range(2)), key=str)
    assert [g[:3] for g in got] == [(1, 0, [0, 7]), (2, 0, [0, 7])] and all(g[3] == pytest.approx(want) for g in got)
    t0 = time.perf_counter()
    with pytest.raises(RuntimeError):  # member 2 exited: the sender fails, it does not wait forever
        send_header(group, [1, 7])
        for b in pack(manifest, list(state.values())):
            group.broadcast(b)
    assert time.perf_counter() - t0 < 10
    survivor = out.get(timeout=30)  # member 1 waited for data that never came: its timeout, then an error
    assert survivor[:2] == (1, "error") or survivor[:2] == (1, 1)
    for p in procs:
        p.join(timeout=30)
    group.close()


def test_config_says_what_the_collective_transport_can_carry():
    from grpo_dist.config import ConfigError, load_config
    from grpo_dist.rollout.weight_group import EXTENSION, weight_group_engine_kwargs
    from grpo_dist.sync import nccl_api

    def cfg(**sections):
        over = {"sync": {"transport": "collective"}, "rollout": {"backend": "vllm"}}
        for k, v in sections.items():
            over[k] = {**over.get(k, {}), **v}
        return load_config(None, over)

    full = cfg(lora={"enabled": False})
    assert full.sync.bucket_mb == 256 and not nccl_api.uses_nccl(full)
    assert weight_group_engine_kwargs(full) == {"worker_extension_cls": EXTENSION}
    assert weight_group_engine_kwargs(cfg(sync={"transport": "object_store"}, lora={"enabled": False})) == {}
    assert cfg().lora.enabled  # LoRA on CPU engines: merged (auto) in the engine
    gpu = cfg(lora={"enabled": False}, cluster={"rollout_gpus": 1, "learner_gpus": 1, "num_cpus": None})
    assert nccl_api.uses_nccl(gpu) and weight_group_engine_kwargs(gpu) == {"weight_transfer_config": {"backend": "nccl"}}
    # one GPU shared by the learner and an engine (fractions): NCCL refuses two ranks on one device, gloo serves
    one = cfg(lora={"enabled": False}, sync={"collective_backend": "gloo"},
              cluster={"rollout_gpus": 0.5, "learner_gpus": 0.5, "num_cpus": None})
    assert not nccl_api.uses_nccl(one) and weight_group_engine_kwargs(one) == {"worker_extension_cls": EXTENSION}
    for bad, why in [({"rollout": {"backend": "hf"}}, "rollout.backend: vllm"),
                     ({"rollout": {"adapter_mode": "lora"}}, "merge them"),
                     ({"cluster": {"rollout_gpus": 1, "num_cpus": None}}, "merge them"),
                     ({"lora": {"enabled": False}, "cluster": {"rollout_gpus": 1, "learner_gpus": 1, "num_cpus": None,
                                                               "layout": "colocated"}}, "disaggregated"),
                     ({"lora": {"enabled": False}, "sync": {"collective_backend": "nccl"}}, "learner and engines on GPUs"),
                     ({"sync": {"collective_backend": "nccl"}, "cluster": {"rollout_gpus": 1, "learner_gpus": 1,
                                                                          "num_cpus": None}}, "merge them|full weights")]:
        with pytest.raises(ConfigError, match=why):
            cfg(**bad)
