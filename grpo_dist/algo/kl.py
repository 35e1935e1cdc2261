"""Per-token KL estimators between the policy and a reference policy (Schulman's k1/k2/k3).

With ``delta = logp - ref_logp`` (log pi_theta - log pi_ref at the sampled token):

* ``k1``  = ``delta``                            unbiased for KL(pi||ref), can be negative
* ``k2``  = ``0.5 * delta**2``                   >= 0, low variance, biased
* ``k3``  = ``exp(-delta) + delta - 1``          >= 0, unbiased; TRL, DeepSeekMath.
  Unclamped, as DeepSeekMath and TRL write it.
* ``low_var_kl`` = verl's clamped k3: ``kl = clamp(ref - logp, -20, 20)``,
  ``clamp(exp(kl) - kl - 1, -10, 10)``.

Shape of ``k3``: it is *not* symmetric in ``delta``. For ``delta < 0`` (policy less likely
than the reference) it grows like ``exp(|delta|)``; for ``delta > 0`` it grows only linearly
(``~ delta - 1``). So for every ``d > 0``: ``k3(-d) > k3(+d)``. (Some GRPO write-ups say the
``delta > 0`` side grows exponentially; the formula ``exp(-delta) + delta - 1`` says the
opposite, and the formula is what is implemented and tested.)
"""

from __future__ import annotations

from typing import Optional

import torch

__all__ = ["kl_penalty", "naive_kl", "KL_KINDS"]

KL_KINDS = ("k1", "k2", "k3", "low_var_kl")


def kl_penalty(logp: torch.Tensor, ref_logp: torch.Tensor, kind: str = "k3") -> torch.Tensor:
    """Per-token KL penalty.

    Args:
        logp: ``[B, T]`` log-probs of the sampled tokens under the policy (with grad).
        ref_logp: ``[B, T]`` log-probs under the reference policy (broadcastable to ``logp``).
        kind: one of ``"k1"``, ``"k2"``, ``"k3"``, ``"low_var_kl"`` (see module docstring).

    Returns:
        ``[B, T]`` penalty, unmasked (callers mask / aggregate). Zero where ``logp == ref_logp``.
    """
    if kind not in KL_KINDS:
        raise ValueError(f"unknown KL estimator kind {kind!r}; expected one of {KL_KINDS}")
    delta = logp - ref_logp
    if kind == "k1":
        return delta
    if kind == "k2":
        return 0.5 * delta.square()
    if kind == "k3":
        # exp(ref - logp) - (ref - logp) - 1
        return torch.exp(-delta) + delta - 1.0
    kl = torch.clamp(ref_logp - logp, min=-20.0, max=20.0)
    return torch.clamp(torch.exp(kl) - kl - 1.0, min=-10.0, max=10.0)


def naive_kl(logp: torch.Tensor, old_logp: torch.Tensor, mask: Optional[torch.Tensor] = None) -> torch.Tensor:
    """The "naive KL" of the ``seed_notebook`` preset: masked mean of ``logp - old_logp`` (a k1 estimate), 0-d tensor.

    Args:
        logp, old_logp: ``[B, T]`` (or ``[N]``) log-probs. mask: same shape, float/bool/int;
            ``None`` = all ones. A fully masked input gives 0.
    """
    delta = logp - old_logp
    if mask is None:
        return delta.mean() if delta.numel() else delta.sum()
    m = mask.to(torch.bool)
    num = torch.where(m, delta, torch.zeros_like(delta)).sum()
    return num / m.sum().clamp(min=1).to(delta.dtype)
