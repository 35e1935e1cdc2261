"""algo.rollout_is in the learner (in-process, tiny model, 4 micro-batches): none leaves the loss
as it was; truncate / mask give exactly grpo_dist.algo's loss with rollout_is_weights(pi_old,
behaviour) on the policy term; pi_old's source in each mode; the metrics' reduction."""

from __future__ import annotations

import random

import pytest
import torch

from grpo_dist.algo import grpo_loss, rollout_is_weights
from grpo_dist.learner import Learner
from grpo_dist.util.ports import free_port
from grpo_dist.testing.learner import loss_inputs, random_batch, randomize_lora, small_config

pytestmark = pytest.mark.usefixtures("in_process_learners")


@pytest.fixture(scope="module")
def learner(tiny_model_dir):
    learner = Learner(small_config(tiny_model_dir, algo=dict(beta=0.04)), master_port=free_port())
    learner.setup()
    randomize_lora(learner, seed=3)  # policy != reference, so the KL term is not 0
    return learner


def behaviour_of(learner, batch, noise: float, seed: int = 0) -> list[list[float]]:
    """The learner's own log-probs plus seeded noise: a rollout engine that disagrees with it."""
    rng = random.Random(seed)
    return [[x + rng.gauss(0.0, noise) for x in row] for row in learner.compute_logprobs(batch)]


def padded(rows, like):
    out = torch.zeros_like(like)
    for i, r in enumerate(rows):
        out[i, :len(r)] = torch.tensor(r, dtype=like.dtype)
    return out


def set_is(learner, mode, level="token", threshold=2.0, low=None):
    a = learner.cfg.algo
    a.rollout_is_threshold_low = None
    a.rollout_is, a.rollout_is_level, a.rollout_is_threshold = mode, level, threshold
    a.rollout_is_threshold_low = low


def direct(learner, t, is_weights=None):
    a = learner.cfg.algo
    loss, m = grpo_loss(t["logp"].double(), t["logp"].double(), t["ref_logp"].double(), t["advantages"].double(),
                        t["mask"], beta=a.beta, clip_low=a.clip_low, clip_high=a.clip_high, kl_kind=a.kl_kind,
                        agg=a.agg, is_weights=is_weights)
    return float(loss), m


def test_none_leaves_the_loss_unchanged(learner):
    set_is(learner, "none")
    batch = random_batch(8, seed=21)
    batch.behaviour_logprobs = behaviour_of(learner, batch, noise=0.5)
    t = loss_inputs(learner, batch)
    want, _ = direct(learner, t)
    m = learner.train_step(batch)
    assert m["train/loss"] == pytest.approx(want, abs=2e-6, rel=1e-5)
    assert not [k for k in m if k.startswith("train/is_")]
    assert m["train/logprob_diff_behaviour_max"] > 0.1  # the disagreement is there, and ignored


@pytest.mark.parametrize("mode,level,threshold,low", [
    ("truncate", "token", 1.5, None), ("truncate", "sequence", 2.0, None),
    ("mask", "token", 2.0, None), ("mask", "sequence", 3.0, 0.2)])
def test_weighted_loss_equals_algo_with_the_weights(learner, mode, level, threshold, low):
    set_is(learner, mode, level, threshold, low)
    try:
        batch = random_batch(8, seed=22)
        batch.behaviour_logprobs = behaviour_of(learner, batch, noise=0.6, seed=1)
        t = loss_inputs(learner, batch)
        beh = padded(batch.behaviour_logprobs, t["logp"])
        # pi_old = the learner's own log-probs before the update (num_iterations 1: logp.detach())
        w, wm = rollout_is_weights(t["logp"].double(), beh.double(), t["mask"], mode, level, threshold, low)
        frac = "is_clipped_frac" if mode == "truncate" else "is_masked_frac"
        assert 0 < wm[frac] < 1  # the bound is active on some tokens, not all
        want, _ = direct(learner, t, w)
        unweighted, _ = direct(learner, t)
        m = learner.train_step(batch)
        assert m["train/loss"] == pytest.approx(want, abs=2e-6, rel=1e-5)
        assert abs(want - unweighted) > 1e-4  # the weights mattered
        # micro-batch metrics reduce to the whole-batch values (token-weighted means, maxima)
        for k in ("is_weight_mean", "is_weight_max", "is_ratio_max", frac):
            assert m[f"train/{k}"] == pytest.approx(wm[k], abs=1e-5, rel=1e-5), k
        assert m["train/is_weight_max"] <= threshold + 1e-9
        assert ("train/is_masked_frac" in m) == (mode == "mask")
    finally:
        set_is(learner, "none")


def test_weighted_nll_loss_is_weighted_too(learner):
    from grpo_dist.algo import aggregate, kl_penalty, weighted_nll_loss

    set_is(learner, "truncate", "token", 1.5)
    learner.cfg.algo.loss = "weighted_nll"
    try:
        batch = random_batch(8, seed=25)
        batch.behaviour_logprobs = behaviour_of(learner, batch, noise=0.6, seed=3)
        t = loss_inputs(learner, batch)
        logp, mask, a = t["logp"].double(), t["mask"], learner.cfg.algo
        w, _ = rollout_is_weights(logp, padded(batch.behaviour_logprobs, t["logp"]).double(), mask,
                                  "truncate", "token", 1.5)
        per_token, _ = weighted_nll_loss(logp, t["advantages"].double(), mask)
        kl = torch.where(mask.bool(), kl_penalty(logp, t["ref_logp"].double(), a.kl_kind), 0.0)
        want = aggregate(w * per_token + a.beta * kl, mask, a.agg)
        m = learner.train_step(batch)
        assert m["train/loss"] == pytest.approx(float(want), abs=2e-6, rel=1e-5)
    finally:
        learner.cfg.algo.loss = "clip"
        set_is(learner, "none")


def test_two_iterations_use_the_recomputed_pi_old(learner):
    """num_iterations 2: pi_old is one no-grad pass before the first update; the weights stay fixed
    for both updates, so the IS metrics are those of that pass."""
    set_is(learner, "truncate", "token", 1.5)
    learner.cfg.algo.num_iterations = 2
    try:
        batch = random_batch(8, seed=23)
        batch.behaviour_logprobs = behaviour_of(learner, batch, noise=0.6, seed=2)
        t = loss_inputs(learner, batch)
        _, wm = rollout_is_weights(t["logp"], padded(batch.behaviour_logprobs, t["logp"]), t["mask"],
                                   "truncate", "token", 1.5)
        v0 = learner.version
        m = learner.train_step(batch)
        assert learner.version == v0 + 2
        for k in ("is_weight_mean", "is_weight_max", "is_clipped_frac"):
            assert m[f"train/{k}"] == pytest.approx(wm[k], abs=1e-5, rel=1e-5), k
    finally:
        learner.cfg.algo.num_iterations = 1
        set_is(learner, "none")


def test_missing_behaviour_logprobs_is_an_error(learner):
    set_is(learner, "truncate")
    try:
        with pytest.raises(ValueError, match="algo.rollout_is=truncate needs behaviour_logprobs"):
            learner.train_step(random_batch(8, seed=24))
    finally:
        set_is(learner, "none")


def test_pi_old_source_per_mode(tiny_model_dir):
    """No setup needed: the source is decided in the constructor."""
    def source(**kw):
        return Learner(small_config(tiny_model_dir, **kw)).old_logp_source

    assert source() == "policy"
    assert source(algo=dict(rollout_is="truncate")) == "policy"
    assert source(trainer=dict(async_rollouts=True)) == "behaviour"  # today's async mode
    assert source(trainer=dict(async_rollouts=True), algo=dict(rollout_is="truncate")) == "policy"
    assert source(trainer=dict(async_rollouts=True), algo=dict(rollout_is="mask", rollout_is_level="sequence")) \
        == "policy"
