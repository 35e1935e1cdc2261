"""learner.micro_batch_tokens: micro-batches by a token budget (verl's dynamic batch size).

The split (``batching.token_micro_batches``), and a real DeepSpeed learner stepping on it: the same
gradient and update as the sequence-count split, with as many micro-batches as the budget needs."""

from __future__ import annotations

import pytest

from grpo_dist.learner.batching import range_tokens, token_micro_batches
from grpo_dist.types import TrainBatch


def batch_of(prompts: list[int], comps: list[int], group: int = 1) -> TrainBatch:
    """Sequences with prompt lengths ``prompts`` (the same prompt for ``group`` rows in a row) and
    completion lengths ``comps``."""
    p = [[7 + i // group] * prompts[i] for i in range(len(comps))]
    return TrainBatch(prompt_ids=p, completion_ids=[[5] * n for n in comps], behaviour_logprobs=[],
                      advantages=[0.0] * len(comps))


def test_range_tokens_counts_what_each_layout_runs():
    b = batch_of([4, 4, 4, 3], [2, 5, 1, 6], group=3)  # rows 0-2 share a prompt of 4 tokens
    assert range_tokens(b, range(0, 3), packed=True) == 4 + 2 + 5 + 1  # the group's prompt once
    assert range_tokens(b, range(0, 4), packed=True) == 4 + 2 + 5 + 1 + 3 + 6
    assert range_tokens(b, range(0, 4), packed=False) == 4 * 9  # rows x the longest (3 + 6)
    assert range_tokens(b, range(1, 2), packed=False) == 9


@pytest.mark.parametrize("packed", [True, False])
def test_budget_split_is_contiguous_within_budget_and_greedy(packed):
    b = batch_of([4] * 8, [2, 9, 1, 3, 12, 2, 2, 7], group=4)
    for budget in (1, 10, 16, 25, 40, 1000):
        parts = token_micro_batches(b, budget, packed)
        assert [i for r in parts for i in r] == list(range(8)) and all(len(r) for r in parts)
        for r in parts:  # within budget, or a single sequence over it
            assert range_tokens(b, r, packed) <= budget or len(r) == 1
        for r, nxt in zip(parts, parts[1:]):  # greedy: the next sequence would not have fitted
            assert range_tokens(b, range(r.start, nxt.start + 1), packed) > budget
    assert len(token_micro_batches(b, 10**6, packed)) == 1
    assert len(token_micro_batches(b, 1, packed)) == 8


def test_budget_split_to_a_larger_count_splits_the_largest_parts():
    """Every rank runs the micro-batch count of the rank that needs most (a collective per backward
    under ZeRO-2/3): a rank with fewer splits its largest parts."""
    b = batch_of([2] * 6, [10, 1, 1, 1, 1, 8])
    one = token_micro_batches(b, 100, packed=True)
    assert one == [range(0, 6)]
    three = token_micro_batches(b, 100, packed=True, count=3)
    assert [i for r in three for i in r] == list(range(6)) and len(three) == 3
    assert max(range_tokens(b, r, True) for r in three) < range_tokens(b, range(0, 6), True)
    assert len(token_micro_batches(b, 100, packed=True, count=6)) == 6
    with pytest.raises(ValueError, match="7 micro-batches of 6 sequences"):
        token_micro_batches(b, 100, packed=True, count=7)
    with pytest.raises(ValueError, match="fewer"):
        token_micro_batches(b, 5, packed=True, count=1)


def test_config_budget_skips_the_count_check():
    from grpo_dist.config import ConfigError, config_from_dict

    base = {"rollout": {"prompts_per_step": 3, "group_size": 4}, "learner": {"micro_batch_size": 5}}
    with pytest.raises(ConfigError, match="learner.micro_batch_size"):
        config_from_dict(base)
    cfg = config_from_dict({**base, "learner": {"micro_batch_size": 5, "micro_batch_tokens": 64}})
    assert cfg.learner.micro_batch_tokens == 64
    with pytest.raises(ConfigError, match="learner.micro_batch_tokens"):
        config_from_dict({"learner": {"micro_batch_tokens": 0}})


@pytest.mark.usefixtures("in_process_learners")
@pytest.mark.parametrize("packing", ["auto", "off"])
def test_a_budget_trains_like_the_count_split(tiny_model_dir, packing):
    """The same batch through a real DeepSpeed learner split by count (micro_batch_size 2) and by a
    token budget: the same loss, gradient norm and updated adapter; the step reports how many
    micro-batches it ran."""
    from grpo_dist.testing.learner import make_learner, random_batch, small_config

    batch = random_batch(seed=3)
    out = {}
    for name, learner_cfg in (("count", {"micro_batch_size": 2}), ("tokens", {"micro_batch_tokens": 30}),
                              ("whole", {"micro_batch_tokens": 10**6})):
        learner, _ = make_learner(small_config(tiny_model_dir, learner={**learner_cfg, "packing": packing},
                                               algo={"beta": 0.04}))
        try:
            m = learner.train_step(batch)
            sd = {k: v.detach().float().clone() for k, v in learner.engine.module.named_parameters()
                  if v.requires_grad}
        finally:
            learner.shutdown()
        out[name] = (m, sd)
    m_count, sd_count = out["count"]
    for name in ("tokens", "whole"):
        m, sd = out[name]
        assert m["train/loss"] == pytest.approx(m_count["train/loss"], rel=1e-4, abs=1e-6)
        assert m["train/grad_norm"] == pytest.approx(m_count["train/grad_norm"], rel=1e-4)
        assert max(float((sd[k] - sd_count[k]).abs().max()) for k in sd) < 1e-5  # lr 2e-3: a step moves ~lr
    assert out["count"][0]["train/micro_batches"] == 4.0  # 8 sequences / 2
    assert out["whole"][0]["train/micro_batches"] == 1.0
    assert 1.0 < out["tokens"][0]["train/micro_batches"] < 8.0
