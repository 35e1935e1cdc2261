"""Every algo.preset: the learner's train/loss equals grpo_dist.algo called directly on the tensors
the learner saw (one in-process learner per preset, on the demo's base model; the default preset
also runs through the whole pipeline in test_presets_e2e.py)."""

from __future__ import annotations

import pytest

from grpo_dist.algo import aggregate, grpo_loss, weighted_nll_loss
from grpo_dist.config.presets import PRESETS
from grpo_dist.testing.learner import loss_inputs, make_learner, random_batch, randomize_lora, small_config

pytestmark = pytest.mark.usefixtures("in_process_learners")


def direct_loss(cfg, t):
    """grpo_dist.algo on the learner's tensors, configured from the preset (num_iterations == 1:
    the ratio's denominator is the detached policy itself)."""
    a = cfg.algo
    logp, mask, adv = t["logp"].double(), t["mask"], t["advantages"].double()
    ref = t["ref_logp"].double() if "ref_logp" in t else None
    kl_target = logp if a.kl_reference == "old" else ref
    if a.loss == "clip":
        loss, _ = grpo_loss(logp, logp, kl_target if a.beta > 0 else None, adv, mask, beta=a.beta,
                            clip_low=a.clip_low, clip_high=a.clip_high, dual_clip=a.dual_clip, kl_kind=a.kl_kind,
                            agg=a.agg, max_len=a.max_len or cfg.rollout.max_tokens, ratio_level=a.ratio_level)
        return float(loss)
    per_token, _ = weighted_nll_loss(logp, adv, mask)
    return float(aggregate(per_token, mask, a.agg, max_len=cfg.rollout.max_tokens))


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_preset_loss_matches_algo(preset, pretrained_model_dir):
    cfg = small_config(pretrained_model_dir, algo={"preset": preset}, rollout={"max_tokens": 8})
    for k, v in PRESETS[preset].items():
        assert getattr(cfg.algo, k) == v  # the preset filled what the config left unset
    learner, _ = make_learner(cfg)
    randomize_lora(learner, seed=1)  # policy != reference: the KL term is not 0
    batch = random_batch(8, seed=3, vocab=(4, 40))
    expected = direct_loss(cfg, loss_inputs(learner, batch))
    metrics = learner.train_step(batch)  # same weights: the loss before the update
    assert metrics["train/loss"] == pytest.approx(expected, abs=1e-5, rel=1e-4), preset
    assert abs(expected) > 1e-6  # a loss that says something


def test_presets_are_deltas_on_grpo():
    """Each preset states only what differs from grpo (a restated field would hide a change to grpo)."""
    from grpo_dist.config.presets import DELTAS, GRPO

    assert PRESETS["grpo"] == GRPO
    for name, delta in DELTAS.items():
        assert all(GRPO.get(k) != v for k, v in delta.items()), name
        assert PRESETS[name] == {**GRPO, **delta}
