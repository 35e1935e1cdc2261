"""Memory at a real vocabulary (SmolLM2's V = 49152): the learner's selective log-softmax never
holds the [B, T, V] float32 log-probabilities (forward or backward), the naive one does.

Each variant runs in a fresh process and reports its peak RSS above the moment the bf16 logits
exist (the learner's own logits in a bf16 run); the real learner's call path is checked op by op
on the real model in test_real_model.py (slow).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
B, T, V = 4, 512, 49152
FP32_BYTES = B * T * V * 4  # 403 MB: one float32 copy of the logits
CODE = f"""
import resource, torch
torch.set_num_threads(1)
from grpo_dist.algo.logprobs import selective_log_softmax
g = torch.Generator().manual_seed(0)
logits = torch.randn({B}, {T}, {V}, generator=g, dtype=torch.bfloat16).requires_grad_()  # no fp32 temporary
index = torch.randint(0, {V}, ({B}, {T}), generator=g)
grad_out = torch.randn({B}, {T})
def naive(x, i):
    return torch.log_softmax(x.float(), -1).gather(-1, i.unsqueeze(-1)).squeeze(-1)
fn = selective_log_softmax if "{{mode}}" == "selective" else naive
peak0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
out = fn(logits, index)
out.backward(grad_out)
print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak0) * 1024, float(out.sum()))
"""


def _peak(mode: str) -> tuple[int, float]:
    proc = subprocess.run([sys.executable, "-c", CODE.replace("{mode}", mode)], cwd=ROOT, capture_output=True,
                          text=True, timeout=600, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    peak, total = proc.stdout.split()
    return int(peak), float(total)


def test_selective_log_softmax_never_holds_fp32_logits_at_the_real_vocabulary():
    sel, sel_sum = _peak("selective")
    naive, naive_sum = _peak("naive")
    assert abs(sel_sum - naive_sum) <= 1e-3 * abs(naive_sum)  # the same values
    print(f"peak RSS above the bf16 logits, B x T x V = {B} x {T} x {V}: selective {sel / 2**20:.0f} MiB, "
          f"naive {naive / 2**20:.0f} MiB (one fp32 copy {FP32_BYTES / 2**20:.0f} MiB)")
    assert naive > 1.5 * FP32_BYTES  # the naive path holds the fp32 log-softmax (and its upcast)
    # the gradient (bf16, half an fp32 copy) + two chunk buffers (128 MiB each) + slack
    assert sel < FP32_BYTES // 2 + 2 * 128 * 2**20 + 128 * 2**20, sel
