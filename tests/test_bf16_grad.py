"""benchmarks/bf16_grad.py: the learner's first gradient with a bf16 base against float32 on one batch."""

from __future__ import annotations

import os

import torch
from scripts import load_script

from grpo_dist.testing.learner import random_batch

SCRIPT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks", "bf16_grad.py")


def test_a_bf16_base_moves_the_gradient_a_little_and_float32_not_at_all(tiny_model_dir):
    mod = load_script(SCRIPT)
    batch = random_batch(8, seed=5)
    g = {s: mod.first_gradient(str(tiny_model_dir), *s, batch, 4) for s in mod.SETTINGS}
    again = mod.first_gradient(str(tiny_model_dir), "float32", "float32", batch, 4)
    ref = g[mod.SETTINGS[0]]
    flat = {s: torch.cat([v[k].flatten() for k in sorted(ref)]).double() for s, v in g.items()}
    f32 = flat[mod.SETTINGS[0]]
    assert f32.norm() > 0 and all(torch.equal(again[k], ref[k]) for k in ref)  # deterministic
    for s in mod.SETTINGS[1:]:
        cos = float(flat[s] @ f32 / (flat[s].norm() * f32.norm()))
        assert 0.9 < cos < 1.0, (s, cos)  # close, not equal: bf16 activations
