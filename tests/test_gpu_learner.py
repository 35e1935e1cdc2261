"""The learner's collectives on a GPU with NCCL (marked ``gpu``: skipped where no CUDA device is).

CPU-side tests of the same code (the device picked for each backend, the defaults by device)
are in ``tests/test_devices.py``.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from grpo_dist.util.ports import free_port

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

RANKS = Path(__file__).with_name("gpu_ranks.py")


def test_nccl_one_rank_learner_and_every_collective(tiny_model_dir, tmp_path, in_process_learners):
    """World 1 on NCCL: a learner trains (ZeRO-2, top-entropy selection, KL reference), saves and
    exports; then every learner collective runs on that NCCL group with CPU-born values (before
    the fix ``MetricAccumulator.reduce`` all-reduced CPU tensors: NCCL raises)."""
    import torch.distributed as dist

    from grpo_dist.config import config_from_dict
    from grpo_dist.learner import Learner
    from grpo_dist.learner.state import MetricAccumulator, all_reduce_floats, barrier, collective_device

    cfg = config_from_dict(dict(
        model={"path": str(tiny_model_dir), "dtype": "float32"}, lora={"dropout": 0.0},
        rollout={"prompts_per_step": 2, "group_size": 4, "max_tokens": 8},
        learner={"micro_batch_size": 2, "zero_stage": 2, "comm_backend": "nccl"},
        algo={"beta": 0.04, "top_entropy_frac": 0.5}, cluster={"learner_gpus": 1}))
    learner = Learner(cfg, rank=0, world_size=1, master_port=free_port())
    learner.setup()
    assert dist.get_backend() == "nccl" and learner.device.type == "cuda"
    sys.path.insert(0, str(RANKS.parent))
    from gpu_ranks import batch

    m = learner.train_step(batch(8, 0))
    assert math.isfinite(m["train/loss"]) and m["train/entropy_selected_frac"] <= 0.6
    assert m["perf/learner_tflops"] > 0 and 0 < m["perf/mfu"] < 1  # against the card's table peak
    learner.save_checkpoint(tmp_path / "ckpt")
    assert learner.export_update().version == 1
    # the collectives themselves, forced through the NCCL group (world 1 skips them in train_step)
    assert collective_device() == torch.device("cuda", torch.cuda.current_device())
    assert all_reduce_floats([1.0, 2.5]) == [1.0, 2.5]
    assert all_reduce_floats([3.0, -1.0], "max") == [3.0, -1.0]
    acc = MetricAccumulator()
    acc.add({"loss": 0.5, "kl_mean": 0.1, "ratio_max": 1.2, "ratio_min": 0.9}, tokens=4)
    assert acc.reduce(world_size=2) == acc.reduce(world_size=1)
    barrier()
    parts = [None]
    dist.all_gather_object(parts, torch.arange(3.0))
    assert parts[0].tolist() == [0.0, 1.0, 2.0]


def _run_ranks(world: int, backend: str, model_dir: Path, tmp: Path, timeout: float = 300):
    port = free_port()
    outs = [tmp / f"w{world}_{backend}_r{r}.json" for r in range(world)]
    procs = [subprocess.Popen([sys.executable, str(RANKS), str(r), str(world), str(port), backend, str(model_dir),
                               str(outs[r])], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for r in range(world)]
    logs = []
    for p in procs:
        try:
            logs.append(p.communicate(timeout=timeout)[0])
        except subprocess.TimeoutExpired:
            p.kill()
            logs.append(p.communicate()[0] + "\n<timed out>")
    codes = [p.returncode for p in procs]
    results = [json.loads(o.read_text()) if o.is_file() else None for o in outs]
    return codes, results, logs


def test_two_ranks_on_one_gpu(tiny_model_dir, tmp_path):
    """Two learner processes on one GPU. NCCL is tried first; it refuses two ranks on one device
    in current releases ("Duplicate GPU detected"), in which case that error is reported and the
    same two ranks run with gloo on CUDA tensors (the learner and DeepSpeed on cuda:0, the
    learner's own collectives on CPU as gloo wants). Either way the two ranks must agree with
    one process on the whole batch (loss normalised by global counts)."""
    codes1, res1, logs1 = _run_ranks(1, "nccl", tiny_model_dir, tmp_path)
    assert codes1 == [0], logs1[0][-3000:]
    codes, res, logs = _run_ranks(2, "nccl", tiny_model_dir, tmp_path, timeout=180)
    backend = "nccl"
    if codes != [0, 0]:
        err = next((ln for log in logs for ln in log.splitlines() if "Duplicate GPU" in ln or "NCCL" in ln
                    or "Error" in ln), logs[0][-500:])
        print(f"\nNCCL, 2 ranks on one GPU: exit codes {codes}; {err.strip()}")
        backend = "gloo"
        codes, res, logs = _run_ranks(2, "gloo", tiny_model_dir, tmp_path)
        assert codes == [0, 0], "\n".join(x[-3000:] for x in logs)
    else:
        print("\nNCCL, 2 ranks on one GPU: ran")
    one = res1[0]["steps"]
    for r in res:
        assert r["backend"] == backend and r["device"].startswith("cuda")
        for s_two, s_one in zip(r["steps"], one):
            for k in ("train/loss", "train/tokens", "train/sequences", "train/kl"):
                assert s_two[k] == pytest.approx(s_one[k], rel=1e-4, abs=1e-5), (backend, k)
    for k, v in res[0]["export_sums"].items():
        assert v == pytest.approx(res1[0]["export_sums"][k], rel=1e-3, abs=1e-5), k
    print(f"2 ranks ({backend}) == 1 rank (nccl): loss {res[0]['steps'][1]['train/loss']:.6f} vs "
          f"{one[1]['train/loss']:.6f}")
