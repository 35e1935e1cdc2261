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
    seven = token_micro_batches(b, 100, packed=True, count=7)  # past the rows: an empty range after them
    assert seven == [range(i, i + 1) for i in range(6)] + [range(6, 6)]
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


# ---------------------------------------------------------------- uneven shards (issue 42, B1)
def rollout(prompt: list[int], n: int, segments=None):
    from grpo_dist.types import Rollout

    return Rollout(prompt_id=prompt[0], prompt="", prompt_ids=prompt, completion="", completion_ids=[5] * n,
                   logprobs=[-1.0] * n, finish_reason="stop", adapter_version=0, segments=segments)


def layouts(seed: int = 0):
    """The batches that shard unevenly over learner ranks: an agent's earlier segments (extra rows
    after the groups, ``batch.build_batch``), the groups dynamic sampling kept (G odd), a batch of
    a size no rank count divides; ``(name, batch)``."""
    import random

    from grpo_dist.batch import build_batch
    from grpo_dist.config import AlgoConfig
    from grpo_dist.types import RewardResult, RolloutGroup

    rng = random.Random(seed)

    def groups(n: int, G: int, segment_every: int = 0):
        out = []
        for g in range(n):
            prompt = [10 + g] * rng.randint(2, 24)
            rs = []
            for j in range(G):
                k = g * G + j
                segs = ([rollout([90 + k] * rng.randint(2, 24), rng.randint(1, 60))]
                        if segment_every and k % segment_every == 0 else None)
                rs.append(rollout(prompt, rng.randint(1, 60), segs))
            out.append(RolloutGroup(prompt_id=g, rollouts=rs))
        return out

    def built(gs, G):
        n = len(gs) * G
        return build_batch(gs, RewardResult(total=[float(i % 2) for i in range(n)], per_function={}), G,
                           AlgoConfig(), max_tokens=64)[0]

    yield "agent_segments", built(groups(4, 4, segment_every=5), 4)  # 16 trajectories + 4 segments
    yield "dynamic_sampling_kept_3_of_4_groups", built(groups(3, 3), 3)  # 9 rows
    yield "not_divisible", built(groups(2, 5), 5)  # 10 rows (3 ranks)


def test_the_issue_example_runs_an_empty_micro_batch_on_the_rank_short_of_rows():
    """17 rows of 20 + 60 tokens, budget 64, 2 ranks: rank 1 (9 rows) needs 9 micro-batches,
    rank 0 has 8 rows; it runs them one each and one empty range after them (it raised "cannot
    split into 9 micro-batches of 8 sequences")."""
    b = batch_of([20] * 17, [60] * 17)
    shards = [b.shard(r, 2) for r in range(2)]
    assert [len(token_micro_batches(s, 64, packed=True)) for s in shards] == [8, 9]
    assert token_micro_batches(shards[0], 64, packed=True, count=9) == [range(i, i + 1) for i in range(8)] + [
        range(8, 8)]
    assert token_micro_batches(shards[1], 64, packed=True, count=9) == [range(i, i + 1) for i in range(9)]
    empty = batch_of([], [])
    assert token_micro_batches(empty, 64, packed=True, count=2) == [range(0, 0)] * 2  # a rank with no rows


@pytest.mark.parametrize("packed", [True, False])
@pytest.mark.parametrize("ranks", [2, 3])
def test_every_uneven_layout_splits_to_one_count_on_every_rank(packed, ranks):
    """Each layout sharded over ``ranks``: every rank runs the same number of micro-batches (the
    largest rank's need), its rows in order, each range within the budget or one sequence, and
    empty ranges only after its last row."""
    for name, b in layouts():
        shards = [b.shard(r, ranks) for r in range(ranks)]
        for budget in (16, 64, 100, 250, 10**6):
            count = max(len(token_micro_batches(s, budget, packed)) for s in shards)
            for s in shards:
                parts = token_micro_batches(s, budget, packed, count=count)
                assert len(parts) == count, (name, budget)
                real = [r for r in parts if len(r)]
                assert [i for r in real for i in r] == list(range(len(s))), (name, budget)
                assert parts[len(real):] == [range(len(s), len(s))] * (count - len(real)), (name, budget)
                assert all(range_tokens(s, r, packed) <= budget or len(r) == 1 for r in real), (name, budget)
    assert len(dict(layouts())["agent_segments"]) == 20


def test_micro_batch_rows_pads_a_short_rank_with_empty_ranges():
    from grpo_dist.learner.batching import micro_batch_rows

    assert micro_batch_rows(5, 2) == [range(0, 2), range(2, 5)]
    assert micro_batch_rows(2, 4) == [range(0, 1), range(1, 2), range(2, 2), range(2, 2)]
    with pytest.raises(ValueError, match="0 micro-batches"):
        micro_batch_rows(3, 0)


def test_an_idle_micro_batch_trains_on_nothing():
    """The micro-batch of an empty range: one short sequence, loss mask 0, advantage 0, behaviour
    log-probs where the batch has them; padded and packed."""
    from grpo_dist.learner.batching import collate, idle_batch
    from grpo_dist.learner.packing import collate_packed

    b = batch_of([3, 3], [2, 4])
    for with_behaviour in (False, True):
        b.behaviour_logprobs = [[-0.5] * len(c) for c in b.completion_ids] if with_behaviour else []
        idle = idle_batch(b, pad_id=0)
        for mb in (collate(idle), collate_packed(idle, group=True), collate_packed(idle, max_len=8)):
            assert float(mb.mask.sum()) == 0.0 and mb.advantages.tolist() == [0.0]
            assert (mb.behaviour_logp is not None) == with_behaviour


# ---------------------------------------------------------------- the split's cost (issue 42, minor)
def old_split(batch, parts, count, packed, budget, pack_len=0):
    """``split_micro_batches`` as it was defined before it was made linear per split (a
    ``range_tokens`` sum for every candidate cut: quadratic per split): the reference."""
    def tokens(r):
        return range_tokens(batch, r, packed, pack_len)

    parts = list(parts)
    while len(parts) < count:
        k = max((j for j, r in enumerate(parts) if len(r) > 1), key=lambda j: tokens(parts[j]))
        r = parts[k]
        half = tokens(r) / 2
        cut = next((c for c in range(r.start + 1, r.stop) if tokens(range(r.start, c)) >= half), r.stop - 1)
        parts[k:k + 1] = [range(r.start, cut), range(cut, r.stop)]
    return parts


def random_grouped_batch(rng, n: int) -> TrainBatch:
    """Runs of 1..5 rows sharing a prompt (groups, agent segments), ragged lengths, some ties."""
    prompts, i = [], 0
    while len(prompts) < n:
        p = [i] * rng.choice([1, 4, 4, 9, 20])
        prompts += [p] * min(rng.randint(1, 5), n - len(prompts))
        i += 1
    return TrainBatch(prompt_ids=prompts, completion_ids=[[5] * rng.choice([0, 1, 3, 3, 8, 30]) for _ in range(n)],
                      behaviour_logprobs=[], advantages=[0.0] * n)


def test_split_gives_the_old_definition_s_ranges():
    import random

    from grpo_dist.learner.batching import split_micro_batches

    rng = random.Random(0)
    checked = 0
    for trial in range(300):
        b = random_grouped_batch(rng, rng.randint(1, 40))
        packed = trial % 2 == 0
        pack_len = rng.choice([0, 12, 30]) if packed else 0
        budget = rng.choice([1, 10, 25, 60, 200, 10**6])
        parts = token_micro_batches(b, budget, packed, pack_len=pack_len)
        for count in sorted({len(parts), min(len(parts) + 1, len(b)), rng.randint(len(parts), len(b)), len(b)}):
            got = split_micro_batches(b, parts, count, packed, budget, pack_len=pack_len)
            assert got == old_split(b, parts, count, packed, budget, pack_len), (trial, count)
            checked += 1
    assert checked > 600


def test_budget_split_counts_a_prompt_as_each_packed_layout_runs_it():
    """``range_tokens`` (what the budget counts) equals the tokens the packed layouts run: the
    group layout runs a prompt once per run of rows sharing it; the mask layout once per packed
    row of at most ``pack_len`` tokens, so a group longer than that repeats its prompt (counted
    once per group before: the budget undercounted what that layout runs)."""
    import random

    from grpo_dist.learner.packing import collate_packed

    rng = random.Random(1)
    repeated = 0
    for _ in range(200):
        b = random_grouped_batch(rng, rng.randint(1, 20))
        b.completion_ids = [c or [5] for c in b.completion_ids]
        lo = rng.randrange(len(b))
        rows = range(lo, rng.randint(lo + 1, len(b)))
        assert range_tokens(b, rows, True) == collate_packed(b, rows, group=True).tokens
        for pack_len in (8, 24, 64):
            want = collate_packed(b, rows, max_len=pack_len).tokens
            assert range_tokens(b, rows, True, pack_len) == want
            repeated += want > range_tokens(b, rows, True)
    assert repeated > 20  # the case that differs is exercised


@pytest.mark.usefixtures("in_process_learners")
def test_an_idle_micro_batch_adds_exactly_nothing(tiny_model_dir):
    """A rank short of rows (3 rows, 4 micro-batches: ``micro_batch_size`` 2 of a per-rank batch of
    8) runs its rows one each and an idle micro-batch; the step's loss, metrics and gradient are bit
    for bit those of the same three micro-batches alone (a budget of 1 token: one row each)."""
    import torch

    from grpo_dist.testing.learner import make_learner, random_batch, small_config, train_step_with_grads
    from grpo_dist.testing.learner import randomize_lora

    batch = random_batch(3, seed=5)
    out = {}
    for name, learner_cfg in (("idle", {"micro_batch_size": 2}), ("alone", {"micro_batch_tokens": 1})):
        learner, _ = make_learner(small_config(tiny_model_dir, learner=learner_cfg, algo={"beta": 0.04}))
        try:
            randomize_lora(learner, seed=3)
            out[name] = train_step_with_grads(learner, batch)
        finally:
            learner.shutdown()
    (g_idle, m_idle), (g_alone, m_alone) = out["idle"], out["alone"]
    assert (m_idle["train/micro_batches"], m_alone["train/micro_batches"]) == (4.0, 3.0)
    for k in ("train/loss", "train/kl", "train/tokens", "train/sequences", "train/entropy", "train/grad_norm"):
        assert m_idle[k] == m_alone[k], k
    assert set(g_idle) == set(g_alone) and any(float(g.abs().max()) > 0 for g in g_idle.values())
    for k, g in g_idle.items():
        assert torch.equal(g, g_alone[k]), k
