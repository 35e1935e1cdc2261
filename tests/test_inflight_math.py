"""In-flight updates' off-policy math (issue 44 item 3): a sample whose tokens come from two weight
versions carries, per token, the behaviour log-prob of the version that sampled it, through
``build_batch`` and the learner's collation, and the learner's loss (the clipped ratio against
the behaviour log-probs; ``algo.rollout_is``'s weights pi_old / pi_behaviour) uses them token by
token: the loss equals a reference computed by hand in float64 from plain lists, and differs from
the loss a single version's log-probs would give (in-process learner, tiny model)."""

from __future__ import annotations

import math

import pytest

from grpo_dist.batch import build_batch, token_version_metrics
from grpo_dist.config import AlgoConfig
from grpo_dist.learner import Learner
from grpo_dist.testing.learner import random_batch, randomize_lora, small_config
from grpo_dist.types import RewardResult, Rollout, RolloutGroup
from grpo_dist.util.ports import free_port

pytestmark = pytest.mark.usefixtures("in_process_learners")

G = 4


@pytest.fixture(scope="module")
def setup(tiny_model_dir):
    """The learner and every sample's log-probs under versions 1 and 2 (two adapters)."""
    learner = Learner(small_config(tiny_model_dir, algo=dict(beta=0.0, agg="token-mean")), master_port=free_port())
    learner.setup()
    shape = random_batch(8, seed=5)
    shape.completion_ids = [c + [7, 9, 11] for c in shape.completion_ids]  # >= 4 tokens: room for two versions
    lp = {}
    for v in (1, 2):  # two adapters: the versions that sampled
        randomize_lora(learner, seed=10 + v, std=0.08)
        lp[v] = learner.compute_logprobs(shape)
    return learner, shape, lp


def mixed_groups(shape, lp):
    """Two groups of G; sample i's first half sampled by version 1, the rest by version 2 (sample 0
    all by version 2); its behaviour log-probs are each token's version's."""
    rollouts = []
    for i, (p, c) in enumerate(zip(shape.prompt_ids, shape.completion_ids)):
        cut = 0 if i == 0 else len(c) // 2
        versions = [1] * cut + [2] * (len(c) - cut)
        beh = [lp[v][i][t] for t, v in enumerate(versions)]
        rollouts.append(Rollout(prompt_id=i // G, prompt="p", prompt_ids=p, completion="c", completion_ids=c,
                                logprobs=beh, finish_reason="length", adapter_version=min(versions),
                                token_versions=versions))
    groups = [RolloutGroup(k, rollouts[k * G:(k + 1) * G]) for k in range(len(rollouts) // G)]
    rewards = [float(i % 3) for i in range(len(rollouts))]
    return groups, RewardResult(total=rewards, per_function={"r": rewards})


def hand_loss(new, beh, adv, mode, clip=0.2, cap=2.0):
    """token-mean over every completion token of the per-token loss, from plain floats: ``clip``:
    -min(r A, clip(r) A) with r = exp(new - beh); ``truncate``: pi_old = the learner's own (ratio 1),
    -A min(exp(new - beh), cap)."""
    total, n = 0.0, 0
    for row_new, row_beh, a in zip(new, beh, adv):
        for x, b in zip(row_new, row_beh):
            r = math.exp(x - b)
            if mode == "clip":
                total += -min(r * a, min(max(r, 1 - clip), 1 + clip) * a)
            else:
                total += -a * min(r, cap)
            n += 1
    return total / n


@pytest.mark.parametrize("mode", ["clip", "truncate"])
def test_two_version_sample_loss_equals_the_hand_reference(setup, mode):
    learner, shape, lp = setup
    groups, scores = mixed_groups(shape, lp)
    batch, _ = build_batch(groups, scores, G, AlgoConfig(), max_tokens=64)
    assert batch.adapter_versions[:2] == [2, 1]  # the oldest token's version bounds staleness
    assert batch.behaviour_logprobs[1] == groups[0].rollouts[1].logprobs  # per token, as sampled
    a = learner.cfg.algo
    if mode == "clip":  # async without rollout_is: pi_old = the behaviour log-probs, per token
        learner.old_logp_source, a.rollout_is = "behaviour", "none"
    else:  # rollout_is: pi_old = the learner's own, weights pi_old / pi_behaviour per token
        learner.old_logp_source, a.rollout_is, a.rollout_is_threshold = "policy", "truncate", 2.0
    randomize_lora(learner, seed=13, std=0.08)  # the learner past both versions (train_step updates it)
    new = learner.compute_logprobs(batch)  # its log-probs now, before the update
    assert max(abs(x - y) for r, q in zip(new, lp[2]) for x, y in zip(r, q)) > 1e-3
    try:
        m = learner.train_step(batch)
    finally:
        learner.old_logp_source, a.rollout_is = "policy", "none"
    want = hand_loss(new, batch.behaviour_logprobs, batch.advantages, mode)
    assert m["train/loss"] == pytest.approx(want, rel=1e-5, abs=1e-6)
    # one version's log-probs for every token (the sample's oldest) would give another loss
    one = [lp[min(r.token_versions)][i] for i, r in enumerate(r for g in groups for r in g.rollouts)]
    assert abs(hand_loss(new, one, batch.advantages, mode) - want) > 1e-3


def test_token_version_metrics_of_mixed_samples(setup):
    _, shape, lp = setup
    groups, _ = mixed_groups(shape, lp)
    m = token_version_metrics(groups, learner_version=2)
    assert m["rollout/mixed_version_frac"] == 7 / 8  # all but sample 0
    n1 = sum(len(c) // 2 for c in shape.completion_ids[1:])
    assert m["rollout/token_staleness_mean"] == pytest.approx(n1 / sum(map(len, shape.completion_ids)))
    assert m["rollout/token_staleness_max"] == 1.0
