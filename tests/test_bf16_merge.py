"""benchmarks/bf16_merge.py: what a bf16 merge and a bf16 step lose, on numbers worked by hand."""

from __future__ import annotations

import os

import torch
from scripts import load_script

SCRIPT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks", "bf16_merge.py")


def _mod():
    return load_script(SCRIPT)


def test_a_delta_below_half_the_spacing_is_rounded_away_and_one_above_it_survives():
    mod = _mod()
    w = torch.full((4,), 0.15)  # bf16 spacing at 0.15: 2^-3 * 2^-7 = 2^-10 ~ 9.8e-4
    lost, err2, d2, dot = mod.merge_loss(w, torch.full((4,), 3e-4))  # < half the spacing: gone
    assert lost == 4 and abs(err2 - d2) < 1e-12 and dot == 0
    lost, err2, d2, dot = mod.merge_loss(w, torch.full((4,), 2 ** -10))  # one spacing: kept exactly
    assert lost == 0 and err2 < 1e-12 and abs(dot - d2) < 1e-12


def test_a_step_is_lost_where_it_is_below_half_the_spacing_of_the_weight():
    mod = _mod()
    t = torch.tensor([0.01, 0.5, 2.0]).to(torch.bfloat16)  # spacings ~7.8e-5, 3.9e-3, 1.6e-2 (eps*|x|)
    assert mod.step_lost(t, 1e-3) == 2  # lost on 0.5 and 2.0, kept on 0.01
