"""Per-completion sampling seeds (grpo_dist/rollout/seeds.py) on the transformers backend (fast).

A completion is a function of (trainer seed, step, prompt index, sample index) and the weights:
not of the worker, its rank, the shard it got or the other prompts in its batch.
tests/test_reproducibility.py checks the same on vLLM and whole runs.
"""

from __future__ import annotations

import pytest

from grpo_dist.config import load_config
from grpo_dist.data import PromptRecord
from grpo_dist.rollout.seeds import sample_seed, sample_seeds


def _worker(model_dir, rank: int):
    from grpo_dist.rollout.worker import RolloutWorker

    cfg = load_config(None, ["--model.path", str(model_dir), "--rollout.backend", "hf", "--rollout.max_tokens", "5",
                             "--rollout.group_size", "3", "--learner.micro_batch_size", "24"])
    w = RolloutWorker(cfg, rank=rank)
    w.setup()
    return w


@pytest.fixture(scope="module")
def workers(tiny_model_dir):
    ws = [_worker(tiny_model_dir, 0), _worker(tiny_model_dir, 1)]
    yield ws
    for w in ws:
        w.close()


def recs(n: int, same_text: bool = False):
    return [PromptRecord(id=i, prompt="3+4=" if same_text else f"{i}+{i}=", columns={"answer": "7"}) for i in range(n)]


def ids(groups):
    return [[r.completion_ids for r in g.rollouts] for g in groups]


def test_sample_seed_is_a_stable_pure_function():
    assert sample_seed(0, 1, 2, 3) == sample_seed(0, 1, 2, 3) == 6350052341292866918  # same on every platform
    seeds = [s for row in sample_seeds([(0, step, p) for step in (1, 2) for p in range(64)], 8) for s in row]
    assert len(set(seeds)) == len(seeds) == 2 * 64 * 8 and all(0 <= s < 2**63 for s in seeds)
    assert sample_seed(1, 1, 2, 3) != sample_seed(0, 1, 2, 3)


def test_completions_do_not_depend_on_worker_shard_or_batch(workers):
    w0, w1 = workers
    records = recs(4)
    keys = [(7, 3, 100 + i) for i in range(4)]
    whole = ids(w0.generate(records, keys=keys))
    # two workers (different ranks, so different engine seeds), each with half the batch
    halves = ids(w0.generate(records[:2], keys=keys[:2])) + ids(w1.generate(records[2:], keys=keys[2:]))
    reversed_order = ids(w1.generate(records[::-1], keys=keys[::-1]))[::-1]
    assert whole == halves == reversed_order
    # the G samples of a group differ from each other, and another step gives other samples
    assert any(len({tuple(c) for c in group}) > 1 for group in whole)
    assert ids(w0.generate(records, keys=[(7, 4, 100 + i) for i in range(4)])) != whole


def test_unseeded_calls_advance_one_stream(workers):
    """The old backend re-created its generator from the same seed on every call."""
    w0, _ = workers
    assert ids(w0.generate(recs(2))) != ids(w0.generate(recs(2)))


def test_eval_seed_gives_each_prompt_its_own_stream(workers):
    """``seed=`` (evaluation) means keys (seed, 0, record id): identical prompt texts with different
    ids get different samples; the same call again gives the same ones."""
    w0, w1 = workers
    a = ids(w0.generate(recs(3, same_text=True), seed=1234))
    assert len({tuple(map(tuple, g)) for g in a}) == 3
    assert ids(w1.generate(recs(3, same_text=True), seed=1234)) == a
