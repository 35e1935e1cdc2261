"""The learner's achieved FLOP/s and model FLOPs utilisation (``perf/learner_tflops``, ``perf/mfu``).

FLOPs of one ``train_step``, counted by the Kaplan convention (attention and the LM head left
out):

* an update pass (forward + backward) over ``T`` tokens: ``4 * N * T`` for LoRA (the forward, and
  a backward through the frozen base that needs only the input gradients), ``6 * N * T`` when
  every weight trains (the weight gradients too);
* a no-grad forward (the KL reference, ``pi_old`` for ``num_iterations > 1``, the entropy pass of
  ``top_entropy_frac``): ``2 * N * T``;

with ``N`` the model's parameters less its input and output embeddings, and ``T`` the real (not
padding) tokens the layout runs through the model: each prompt once per packed row plus the
completions when packed, prompt + completion per sequence when padded.

The peak they are divided by:

* on a GPU, the card's dense bf16 tensor peak from ``GPU_PEAK_TFLOPS`` (by device name); a card
  not in the table gets a measured GEMM roof instead;
* on CPU, a matmul roof measured once per process at the run's precision and thread count: the
  best of a few square GEMMs (``cpu_matmul_roof``, well under a second), so ``perf/mfu`` says how
  close the learner runs to what this machine's matrix products reach, not to a datasheet.
"""

from __future__ import annotations

import time
from typing import Optional

import torch

# Dense (no sparsity) bf16 tensor-core peaks in TFLOP/s, from the vendors' datasheets; the first
# name contained in ``torch.cuda.get_device_name()`` wins, so the more specific names come first.
GPU_PEAK_TFLOPS: tuple[tuple[str, float], ...] = (
    ("GH200", 989.4), ("H200", 989.4), ("H100 PCIe", 756.0), ("H100 NVL", 835.0), ("H100", 989.4),
    ("H800", 989.4), ("H20", 148.0), ("B200", 2250.0), ("B100", 1750.0),
    ("A100", 312.0), ("A800", 312.0), ("A30", 165.0), ("A40", 149.7), ("A6000", 154.8),
    ("L40S", 362.1), ("L40", 181.0), ("L4", 121.0), ("A10G", 70.0), ("A10", 125.0),
    ("RTX 4090", 165.2), ("RTX 3090", 71.0), ("V100", 125.0), ("T4", 65.0),
    ("MI300X", 1307.4), ("MI250X", 383.0),
)

_ROOFS: dict[tuple, float] = {}  # (device type, dtype, threads) -> FLOP/s measured in this process


def gpu_peak_tflops(name: str) -> Optional[float]:
    """The dense bf16 peak of the GPU called ``name`` (``torch.cuda.get_device_name``), or None."""
    for key, tflops in GPU_PEAK_TFLOPS:
        if key.lower() in name.lower():
            return tflops
    return None


def matmul_roof(dtype: torch.dtype, device: torch.device | str = "cpu", budget_s: float = 0.4,
                sizes: tuple[int, ...] = (512, 1024)) -> float:
    """FLOP/s of the best square ``n x n @ n x n`` product in ``dtype`` on ``device`` (with the
    process's current torch threads on CPU), measured once per process and cached. Each size runs
    one warm-up product and then repeats for about ``budget_s / len(sizes)`` seconds; a size is
    skipped once the budget is spent."""
    device = torch.device(device)
    key = (device.type, dtype, torch.get_num_threads() if device.type == "cpu" else device.index)
    if key in _ROOFS:
        return _ROOFS[key]
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    best, start = 0.0, time.perf_counter()
    g = torch.Generator(device="cpu").manual_seed(0)
    for n in sizes:
        if time.perf_counter() - start > budget_s:
            break
        a, b = (torch.randn(n, n, generator=g).to(device=device, dtype=dtype) for _ in range(2))
        out = torch.empty(n, n, device=device, dtype=dtype)
        torch.mm(a, b, out=out)  # warm-up: kernels picked, pages touched
        sync()
        until = time.perf_counter() + budget_s / len(sizes)
        while True:
            t0 = time.perf_counter()
            torch.mm(a, b, out=out)
            sync()
            dt = time.perf_counter() - t0
            best = max(best, 2.0 * n ** 3 / dt)
            if time.perf_counter() > until:
                break
    _ROOFS[key] = best
    return best


def peak_flops(device: torch.device, dtype: torch.dtype) -> tuple[float, str]:
    """``(FLOP/s, where the number comes from)`` that ``perf/mfu`` divides by."""
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        tflops = gpu_peak_tflops(name)
        if tflops is not None:
            return tflops * 1e12, f"{name}: dense bf16 peak {tflops:g} TFLOP/s (table)"
        roof = matmul_roof(torch.bfloat16, device)
        return roof, f"{name}: not in the peak table; measured bf16 GEMM roof {roof / 1e12:.1f} TFLOP/s"
    roof = matmul_roof(dtype, device)
    return roof, (f"CPU: measured {str(dtype).removeprefix('torch.')} GEMM roof {roof / 1e9:.0f} GFLOP/s "
                  f"({torch.get_num_threads()} threads)")


def non_embedding_params(module: torch.nn.Module) -> int:
    """Parameters of ``module`` less its input and output embeddings (ZeRO-3 partitions counted
    at their full size)."""
    skip: set[int] = set()
    for get in ("get_input_embeddings", "get_output_embeddings"):
        emb = getattr(module, get, lambda: None)()
        if emb is not None:
            skip.update(id(p) for p in emb.parameters())
    return sum(int(getattr(p, "ds_numel", p.numel())) for p in module.parameters() if id(p) not in skip)


def step_flops(params: int, update_tokens: float, nograd_tokens: float, full_weights: bool) -> float:
    """FLOPs of a step that runs ``update_tokens`` tokens through forward + backward and
    ``nograd_tokens`` through no-grad forwards (both summed over passes)."""
    return (6.0 if full_weights else 4.0) * params * update_tokens + 2.0 * params * nograd_tokens
