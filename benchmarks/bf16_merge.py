"""How much of a trained LoRA adapter survives bf16, where a CPU engine meets it (adapter_mode
merged: the adapter's delta s * B @ A is added into the engine's weights, which are bf16 when
``rollout.dtype``/``model.dtype`` is bfloat16), and where the learner meets it (one optimizer step
of ``--lr`` per element on bf16 A and B).

    python benchmarks/bf16_merge.py RUN/adapter MODEL_DIR [--lr 5e-4]

Prints, over every adapted weight: the mean |delta| and |W|, the fraction of the delta's elements
that the bf16 merge rounds away entirely (bf16(W + d) == bf16(W) while d != 0), the relative error
of the merged delta (|| (bf16(W + d) - bf16(W)) - d || / || d ||), its projection on the delta (the
share of the delta kept along its direction: rounding is nearly unbiased, so this stays near 1 while
the error is noise across the delta), and the fraction of A/B elements
for which a step of ``lr`` is below half the bf16 spacing at their magnitude (lost in a bf16 update).
"""

from __future__ import annotations

import argparse
import glob
import json
import os

import torch


def merge_loss(w: torch.Tensor, d: torch.Tensor) -> tuple[int, float, float, float]:
    """(elements of ``d`` rounded away entirely, squared error of the merged delta, squared norm of
    ``d``, the merged delta's dot product with ``d``)."""
    w, d = w.float(), d.float()
    eff = (w + d).to(torch.bfloat16).float() - w.to(torch.bfloat16).float()
    return (int(((eff == 0) & (d != 0)).sum()), float(((eff - d) ** 2).sum()), float((d ** 2).sum()),
            float((eff * d).sum()))


def step_lost(t: torch.Tensor, lr: float) -> int:
    """Elements of ``t`` (stored in bf16) that a change of ``lr`` does not move: below half the spacing."""
    spacing = torch.finfo(torch.bfloat16).eps * t.float().abs()
    return int((lr < spacing / 2).sum())


def main(argv: list[str] | None = None) -> int:
    from safetensors.torch import load_file

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("adapter")
    ap.add_argument("model")
    ap.add_argument("--lr", type=float, default=5e-4)
    a = ap.parse_args(argv)
    cfg = json.load(open(os.path.join(a.adapter, "adapter_config.json")))
    scale = cfg["lora_alpha"] / cfg["r"]
    ad = load_file(os.path.join(a.adapter, "adapter_model.safetensors"))
    base: dict[str, torch.Tensor] = {}
    for f in glob.glob(os.path.join(a.model, "*.safetensors")):
        base.update(load_file(f))
    n = lost = lost_ab = n_ab = 0
    err2 = d2 = dot = dabs = wabs = 0.0
    modules = 0
    for k, lora_a in ad.items():
        if "lora_A" not in k:
            continue
        lora_b = ad[k.replace("lora_A", "lora_B")]
        w = base[k.replace("base_model.model.", "").replace(".lora_A.weight", ".weight")]
        d = scale * lora_b.float() @ lora_a.float()
        lo, e2, dd, dp = merge_loss(w, d)
        n, lost, err2, d2, dot = n + d.numel(), lost + lo, err2 + e2, d2 + dd, dot + dp
        dabs, wabs, modules = dabs + float(d.abs().mean()), wabs + float(w.float().abs().mean()), modules + 1
        for t in (lora_a, lora_b):
            n_ab, lost_ab = n_ab + t.numel(), lost_ab + step_lost(t, a.lr)
    print(f"{a.adapter}: {modules} adapted weights, scale {scale:g}")
    print(f"merge into bf16 weights: mean |delta| {dabs / modules:.2e}, mean |W| {wabs / modules:.2e}; delta elements "
          f"rounded away entirely {lost / n:.3f}; relative error of the merged delta {(err2 / d2) ** 0.5:.3f}; "
          f"its projection on the delta {dot / d2:.3f} (the share kept along it; the rest of the error is "
          f"rounding noise across it)")
    print(f"a step of {a.lr:g} on bf16 A/B: lost for {lost_ab / n_ab:.4f} of the elements")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
