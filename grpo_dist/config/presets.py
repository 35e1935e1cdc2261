"""Algorithm presets: one config line (``algo.preset``) sets loss, advantage and aggregation together.

A preset only fills fields the user did not set, so every field stays overridable
(``--algo.preset dapo --algo.clip_high 0.3``). Each preset is a delta on ``grpo`` and names its
source.
"""

from __future__ import annotations

from typing import Any

# DeepSeekMath (arXiv 2402.03300): group z-score, clipped ratio, k3 KL vs the
# frozen reference, 1/|o_i| token mean per sequence then 1/G mean. Every other preset is a delta on it.
GRPO: dict[str, Any] = dict(
    loss="clip", adv_estimator="group", adv_scale="group", std_unbiased=True,
    clip_low=0.2, clip_high=0.2, beta=0.04, kl_kind="k3", kl_reference="ref",
    agg="seq-mean-token-mean", ratio_level="token",
)

DELTAS: dict[str, dict[str, Any]] = {
    "grpo": {},
    # TRL "bnpo": the loss normalised by the number of completion tokens in the batch.
    "bnpo": dict(agg="token-mean"),
    # DAPO (arXiv 2503.14476): token-mean, clip-higher, no KL, dynamic sampling, overlong shaping.
    "dapo": dict(clip_high=0.28, beta=0.0, agg="token-mean", dynamic_sampling=True,
                 overlong_buffer=0.25, overlong_penalty=1.0),
    # Dr. GRPO (arXiv 2503.20783): no std scaling, constant length normaliser, no KL.
    "dr_grpo": dict(adv_scale="none", beta=0.0, agg="seq-mean-token-sum-norm"),
    # GSPO (arXiv 2507.18071): sequence-level (length-normalised) importance ratio, tiny clip range.
    "gspo": dict(clip_low=3e-4, clip_high=4e-4, beta=0.0, ratio_level="sequence"),
    # RLOO (arXiv 2402.14740): leave-one-out mean baseline, no std scaling.
    "rloo": dict(adv_estimator="rloo", adv_scale="none"),
    # The group-wise softmax-weighted variant: in-group softmax weights, loss = -sum_i w_i log pi(y_i|x);
    # optional clip and KL.
    "softmax_weighted": dict(loss="weighted_nll", adv_estimator="softmax", adv_scale="none", beta=0.0,
                             agg="seq-mean-token-sum", softmax_temperature=1.0),
    # The GRPO notebook the project started from: biased std + 1e-8, naive KL = mean(log_new - log_old), beta 0.04.
    "seed_notebook": dict(std_unbiased=False, adv_eps=1e-8, kl_kind="k1", kl_reference="old", agg="token-mean"),
}

# each preset in full: grpo with its delta applied
PRESETS: dict[str, dict[str, Any]] = {name: {**GRPO, **delta} for name, delta in DELTAS.items()}


def apply_preset(algo: dict[str, Any]) -> dict[str, Any]:
    """Return ``algo`` with the preset's values filled in where the user gave none."""
    name = algo.get("preset", "grpo")
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; choose one of {sorted(PRESETS)}")
    return {**PRESETS[name], **algo}
