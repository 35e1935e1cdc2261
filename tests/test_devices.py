"""Device-aware defaults, the GPU-request check, the CPU KV-cache precedence, and the device
each process-group backend gets for the learner's collectives (CPU side of
``tests/test_gpu_learner.py``)."""

from __future__ import annotations

import logging
import os

import pytest
import torch

from grpo_dist.config import ConfigError, config_from_dict, load_config
from grpo_dist.devices import check_devices, choices, engine_cpus, learner_on_gpu, torch_threads
from grpo_dist.learner import state
from grpo_dist.learner.state import MetricAccumulator, collective_device
from grpo_dist.rollout import vllm_engine


# ---------------------------------------------------------------------- defaults by device

@pytest.mark.parametrize("over,role,peers,expect", [
    ({}, "learner", 1, 8),  # on-policy CPU run: the roles take turns, the rank gets the node's CPUs
    ({}, "learner", 2, 4),  # two learner ranks on the node split them
    ({}, "learner", 16, 1),
    ({}, "rollout", 2, 4),
    ({"trainer": {"max_staleness": 1}}, "learner", 1, 1),  # generation overlaps: int(learner_cpus) 0.5 -> 1
    ({"trainer": {"max_staleness": 1}, "cluster": {"learner_cpus": 3}}, "learner", 1, 3),
    ({"cluster": {"learner_gpus": 1, "learner_cpus": 2}}, "learner", 1, 2),  # on GPU: its reserved CPUs
    ({"cluster": {"torch_threads": 5}}, "learner", 4, 5),  # a number always wins
])
def test_torch_threads_auto(over, role, peers, expect):
    cfg = config_from_dict(over)
    assert cfg.cluster.torch_threads == over.get("cluster", {}).get("torch_threads", "auto")
    n, why = torch_threads(cfg, role, peers, node_cpus=8)
    assert n == expect and why


@pytest.mark.parametrize("over,index,engines,learners,cpus,expect", [
    ({}, 0, 1, 1, [0, 1], "0,1"),  # on-policy: the roles take turns, the one engine gets the node
    ({}, 0, 2, 1, [0, 1], "0"),  # two engines: disjoint cores (vLLM's auto put both on core 0)
    ({}, 1, 2, 1, [0, 1], "1"),
    ({}, 2, 3, 0, list(range(8)), "4,5"),
    ({"trainer": {"max_staleness": 1}}, 0, 1, 1, [0, 1], "0"),  # overlapping: the learner keeps a core
    ({"trainer": {"max_staleness": 1}}, 1, 2, 1, [0, 1], "1"),  # too few CPUs to keep one: shared
    ({"trainer": {"max_staleness": 1}}, 0, 1, 0, [0, 1], "0,1"),  # no learner on this node
    ({"rollout": {"backend": "hf"}}, 0, 1, 1, [0, 1], None),
    ({"cluster": {"rollout_gpus": 1, "learner_gpus": 1}}, 0, 1, 1, [0, 1], None),
])
def test_engine_cpus(monkeypatch, over, index, engines, learners, cpus, expect):
    monkeypatch.delenv("VLLM_CPU_OMP_THREADS_BIND", raising=False)
    bind, why = engine_cpus(config_from_dict(over), index, engines, learners, cpus)
    assert bind == expect and why


def test_engine_cpus_exported_variable_wins(monkeypatch):
    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", "0-3")
    assert engine_cpus(config_from_dict({}), 0, 2, 0, [0, 1, 2, 3]) == (
        None, "VLLM_CPU_OMP_THREADS_BIND=0-3 exported")


def test_torch_threads_auto_reads_the_local_cluster_size():
    cfg = config_from_dict({"cluster": {"num_cpus": 2}})
    assert torch_threads(cfg, "learner", 1) == (2, "auto: trainer.max_staleness 0, the roles take turns: 2 CPUs "
                                                   "on the node / 1 learner rank(s) there")
    assert load_config("configs/tiny_cpu.yaml").cluster.torch_threads == 1  # the demo's tiny matmuls: 1
    with pytest.raises(ConfigError, match="cluster.torch_threads"):
        load_config(None, ["--cluster.torch_threads", "0"])


XEON = "model name\t: Intel(R) Xeon(R) Platinum 8480+\nflags\t\t: fpu avx2 avx512f amx_bf16 amx_tile\n"
ZEN2 = "model name\t: AMD EPYC 7B12\nflags\t\t: fpu avx2\n"


@pytest.mark.parametrize("cpuinfo,dtype,why", [
    (XEON, "bfloat16", "a CPU-only config, and this CPU (Intel(R) Xeon(R) Platinum 8480+ has AMX_BF16) computes "
                       "bfloat16 natively"),
    (ZEN2, "float32", "a CPU-only config, and this CPU (AMD EPYC 7B12 has no AVX512_BF16, AMX or Arm BF16) "
                      "computes bfloat16 slower than float32"),
])
def test_cpu_defaults_dtype_auto_reads_the_cpu(monkeypatch, cpuinfo, dtype, why):
    """model.dtype auto on a CPU-only config: bfloat16 where the CPU computes it natively, float32
    elsewhere; bfloat16 on GPUs; the start block says which and why. The recipe leaves it to the
    default; the demo pins float32 (its matrices are too small for bf16 to pay), and a value set
    prints no line."""
    import grpo_dist.util.cpu as cpu

    real = cpu.cpu_flags
    monkeypatch.setattr(cpu, "cpu_flags", lambda cpuinfo_=None: real(cpuinfo))
    for cfg in (load_config("configs/smollm2_cpu.yaml"), config_from_dict({})):
        assert (cfg.model.dtype, cfg.rollout.enforce_eager, cfg.rollout.gpu_memory_utilization) == (dtype, True, 0.3)
        # the default: VLLM_CPU_KVCACHE_SPACE if exported, else 1; the recipe sizes its own
        assert cfg.rollout.cpu_kvcache_gb == (0.75 if cfg.data.path.startswith("builtin:word_problems") else None)
        assert choices(cfg)[0].startswith(f"model.dtype auto -> {dtype}: {why}"), choices(cfg)[0]
    pinned = load_config("configs/tiny_cpu.yaml")
    assert pinned.model.dtype == "float32" and not any(x.startswith("model.dtype") for x in choices(pinned))
    gpu = config_from_dict({"cluster": {"learner_gpus": 1, "rollout_gpus": 1}})
    assert gpu.model.dtype == "bfloat16" and choices(gpu)[0] == \
        "model.dtype auto -> bfloat16: the config gives the learner or the engines GPUs"


@pytest.mark.parametrize("cluster,expect", [
    ({"rollout_gpus": 1, "learner_gpus": 1}, ("bfloat16", False, 0.9)),
    ({"rollout_gpus": 0.5, "learner_gpus": 1}, ("bfloat16", False, 0.45)),  # two engines share a GPU
    ({"rollout_gpus": 1, "learner_gpus": 1, "layout": "colocated"}, ("bfloat16", False, 0.5)),
    ({"rollout_gpus": 0, "learner_gpus": 1}, ("bfloat16", True, 0.3)),  # engines on CPU: eager, fraction unused
])
def test_gpu_defaults_follow_the_config_gpu_counts_and_layout(cluster, expect):
    if "layout" in cluster and "layout" not in type(config_from_dict({}).cluster).model_fields:
        pytest.skip("cluster.layout not in this config yet")
    cfg = config_from_dict({"cluster": cluster, "rollout": {"num_workers": 1}})
    assert (cfg.model.dtype, cfg.rollout.enforce_eager, cfg.rollout.gpu_memory_utilization) == expect


def test_explicit_values_win_over_device_defaults():
    cfg = config_from_dict({"cluster": {"rollout_gpus": 1, "learner_gpus": 1}, "model": {"dtype": "float16"},
                            "rollout": {"enforce_eager": True, "gpu_memory_utilization": 0.6}})
    assert (cfg.model.dtype, cfg.rollout.enforce_eager, cfg.rollout.gpu_memory_utilization) == ("float16", True, 0.6)


# ---------------------------------------------------------------------- GPUs requested vs present

def test_gpu_requested_where_none_exists_is_one_line():
    cfg = config_from_dict({"cluster": {"learner_gpus": 1, "rollout_gpus": 1}, "rollout": {"num_workers": 2}})
    with pytest.raises(ConfigError) as e:
        check_devices(cfg, device_count=0)
    msg = str(e.value)
    assert "\n" not in msg and "cluster.learner_gpus=1, cluster.rollout_gpus=1 need 3 GPUs" in msg
    assert "0 CUDA devices" in msg and "set both to 0" in msg
    with pytest.raises(ConfigError, match="need 3 GPUs but this machine has 2 CUDA devices"):
        check_devices(cfg, device_count=2)
    check_devices(cfg, device_count=3)
    check_devices(config_from_dict({"cluster": {"learner_gpus": 1, "address": "auto"}}), device_count=0)  # Ray checks
    check_devices(load_config("configs/tiny_cpu.yaml"), device_count=0)


def test_cli_exits_2_before_anything_starts(monkeypatch, capsys):
    from grpo_dist import cli

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    assert cli.main(["train", "--config", "configs/tiny_cpu.yaml", "--cluster.learner_gpus", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == ("config error: cluster: cluster.learner_gpus=1 need 1 GPUs but this machine has 0 CUDA "
                   "devices; set both to 0 for a CPU run")


def test_learner_device_comes_from_the_config(monkeypatch):
    assert learner_on_gpu(config_from_dict({})) is False  # even where a GPU is visible
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(RuntimeError, match="cluster.learner_gpus=1 but this learner process sees no CUDA"):
        learner_on_gpu(config_from_dict({"cluster": {"learner_gpus": 1}}))


# ---------------------------------------------------------------------- VLLM_CPU_KVCACHE_SPACE

def test_cpu_kvcache_precedence(monkeypatch, caplog):
    monkeypatch.setattr(vllm_engine, "_kv_set_here", None)
    env: dict[str, str] = {}
    assert vllm_engine.cpu_kvcache_space(None, env) == "1" and env["VLLM_CPU_KVCACHE_SPACE"] == "1"
    env = {"VLLM_CPU_KVCACHE_SPACE": "4"}  # the user's export, config unset: the export is used
    monkeypatch.setattr(vllm_engine, "_kv_set_here", None)
    assert vllm_engine.cpu_kvcache_space(None, env) == "4"
    monkeypatch.setattr(vllm_engine, "_kv_set_here", None)
    with caplog.at_level(logging.WARNING, logger="grpo_dist.rollout"):
        assert vllm_engine.cpu_kvcache_space(2, env) == "2"  # config set: it wins, loudly
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "2"
    assert "rollout.cpu_kvcache_gb=2 overrides the exported VLLM_CPU_KVCACHE_SPACE=4" in caplog.text
    caplog.clear()  # a second engine in this process sees our own value, not an export: no warning
    with caplog.at_level(logging.WARNING, logger="grpo_dist.rollout"):
        assert vllm_engine.cpu_kvcache_space(3, env) == "3"
    assert "overrides" not in caplog.text
    # a fraction of a GiB: vLLM's variable takes whole GiB only (int(), even of an empty one) and
    # would override the engine's kv_cache_memory_bytes, so it is removed
    assert vllm_engine.cpu_kvcache_space(0.5, env) == "0.5" and "VLLM_CPU_KVCACHE_SPACE" not in env
    assert vllm_engine.cpu_kvcache_space(None, env) == "1" and env["VLLM_CPU_KVCACHE_SPACE"] == "1"


def test_engine_gets_the_kv_cache_in_bytes(monkeypatch):
    monkeypatch.setattr(vllm_engine, "_kv_set_here", None)
    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)
    kw = vllm_engine.engine_kwargs("m", cpu_kvcache_gb=0.75)
    assert kw["kv_cache_memory_bytes"] == 3 * 2**28
    assert "VLLM_CPU_KVCACHE_SPACE" not in os.environ
    assert load_config(None, ["--rollout.cpu_kvcache_gb", "0.75"]).rollout.cpu_kvcache_gb == 0.75


# ---------------------------------------------------------------------- collectives' device

@pytest.mark.parametrize("backend,device", [
    ("nccl", torch.device("cuda", 1)), ("gloo", torch.device("cpu")), ("mpi", torch.device("cpu")),
    ("cpu:gloo,cuda:nccl", torch.device("cpu")), ("ccl", torch.device("cpu")),
])
def test_collective_device_per_backend(backend, device):
    assert collective_device(backend, cuda_index=1) == device


def _gloo_rank(rank: int, port: int, out) -> None:
    """One rank of a real 2-process gloo group: its metrics reduced, the devices handed to gloo."""
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        seen, real = [], dist.all_reduce

        def spy(t, *a, **kw):
            seen.append(t.device.type)
            return real(t, *a, **kw)

        dist.all_reduce = spy
        acc = MetricAccumulator()
        acc.add({"loss": 0.5 + rank, "kl_mean": 0.1 * (rank + 1), "ratio_max": 1.2 + rank}, tokens=4 * (rank + 1))
        out.put((rank, seen, acc.reduce(world_size=2), state.all_reduce_floats([1.0 + rank, 2.0])))
    finally:
        dist.destroy_process_group()


def test_metric_reduce_uses_cpu_tensors_with_gloo(monkeypatch):
    """Two real gloo ranks: every collective gets CPU tensors, and the reduced metrics are the
    global ones (the loss summed, a token-weighted mean, the max over ranks) on both ranks."""
    import multiprocessing as mp
    from pathlib import Path

    from grpo_dist.util.ports import free_port

    # the spawned ranks unpickle _gloo_rank as tests.test_devices: the project root on their path
    # (run alone, nothing else of the suite puts it there)
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1]))
    ctx = mp.get_context("spawn")
    q, port = ctx.Queue(), free_port()
    procs = [ctx.Process(target=_gloo_rank, args=(r, port, q)) for r in range(2)]
    for p in procs:
        p.start()
    try:
        got = dict((r, rest) for r, *rest in (q.get(timeout=120) for _ in procs))
    finally:
        for p in procs:
            p.join(timeout=30)
    for rank in range(2):
        seen, out, floats = got[rank]
        assert seen == ["cpu", "cpu", "cpu"], seen  # the metrics' SUM and MAX, then all_reduce_floats
        assert out["train/loss"] == pytest.approx(0.5 + 1.5)
        assert out["train/kl"] == pytest.approx((0.1 * 4 + 0.2 * 8) / 12)
        assert out["train/ratio_max"] == pytest.approx(2.2)
        assert floats == [3.0, 4.0]


@pytest.mark.skipif(torch.cuda.is_available(), reason="CPU-only check; tests/test_gpu_learner.py runs real NCCL")
def test_metric_reduce_puts_its_tensors_on_cuda_for_nccl(monkeypatch):
    """Before the fix, ``reduce`` handed NCCL CPU tensors (NCCL raises "No backend type associated
    with device type cpu"). With no CUDA here, the tensors are made where they are asked for but
    kept on the CPU, and the device each collective's tensor was asked on is recorded: both
    reductions ask for ``cuda:0``, and the fake group (two equal ranks) gives the right values."""
    import torch.distributed as dist

    asked: list = []
    real_tensor = torch.tensor

    def tensor(*a, device=None, **kw):
        asked.append(torch.device(device) if device is not None else None)
        return real_tensor(*a, **kw)

    def all_reduce(t, op=None):  # two ranks with the same values
        if op == dist.ReduceOp.SUM:
            t.mul_(2)

    monkeypatch.setattr(dist, "get_backend", lambda group=None: "nccl")
    monkeypatch.setattr(dist, "all_reduce", all_reduce)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch, "tensor", tensor)
    acc = MetricAccumulator()
    acc.add({"loss": 0.5, "kl_mean": 0.1, "ratio_max": 1.2}, tokens=4)
    out = acc.reduce(world_size=2)
    assert asked == [torch.device("cuda", 0)] * 2, asked
    assert out["train/loss"] == pytest.approx(1.0) and out["train/kl"] == pytest.approx(0.1)
    assert out["train/ratio_max"] == pytest.approx(1.2)
