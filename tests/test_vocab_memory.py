"""Memory at a real vocabulary (SmolLM2's V = 49152): the learner's selective log-softmax never
holds the [B, T, V] float32 log-probabilities (forward or backward), the naive one does.

The peak is counted at the allocator: the running sum of the tensor bytes allocated and freed
during the call (torch.profiler's memory events), above the bf16 logits that exist before it. The
process's RSS (ru_maxrss) was the first measure; it read 0 for both variants in CI's sandbox, where
the kernel's high-water mark is not kept per process. The real learner's call path is checked op by
op on the real model in test_real_model.py (slow).
"""

from __future__ import annotations

import torch
from grpo_dist.algo.logprobs import selective_log_softmax
from grpo_dist.util.memory import TensorPeak

B, T, V = 4, 512, 49152
FP32_BYTES = B * T * V * 4  # 403 MB: one float32 copy of the logits


def _naive(x, i):
    return torch.log_softmax(x.float(), -1).gather(-1, i.unsqueeze(-1)).squeeze(-1)


def _peak(fn) -> tuple[int, float]:
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(B, T, V, generator=g, dtype=torch.bfloat16).requires_grad_()
    index = torch.randint(0, V, (B, T), generator=g)
    grad_out = torch.randn(B, T, generator=g)
    with TensorPeak() as peak:
        out = fn(logits, index)
        out.backward(grad_out)
        total = float(out.detach().sum())
    assert peak.extra is not None, "the profiler recorded no allocations"
    return peak.extra, total


def test_selective_log_softmax_never_holds_fp32_logits_at_the_real_vocabulary():
    torch.set_num_threads(1)
    sel, sel_sum = _peak(selective_log_softmax)
    naive, naive_sum = _peak(_naive)
    assert abs(sel_sum - naive_sum) <= 1e-3 * abs(naive_sum)  # the same values
    print(f"peak tensor bytes above the bf16 logits, B x T x V = {B} x {T} x {V}: selective {sel / 2**20:.0f} MiB, "
          f"naive {naive / 2**20:.0f} MiB (one fp32 copy {FP32_BYTES / 2**20:.0f} MiB)")
    assert naive > 1.5 * FP32_BYTES  # the naive path holds the fp32 log-softmax (and its upcast)
    # the gradient (bf16, half an fp32 copy) + two chunk buffers (128 MiB each) + slack
    assert sel < FP32_BYTES // 2 + 2 * 128 * 2**20 + 128 * 2**20, sel
