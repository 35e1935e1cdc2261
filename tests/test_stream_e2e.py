"""rollout.streaming end to end (local Ray, vLLM CPU async engines, DeepSpeed learner).

k = 0: the streaming run trains the same prompts on the same tokens with the same rewards and
losses as the batch pipeline (per-sample seeds). k = 1 (one engine, merged serving: loads drain
the engine) and k = 2 (two engines, LoRA serving: versions coexist): no sample is more than k
versions behind the learner, every sample carries its version, the buffer stays within its
bound, and each group is scored after it finished (that a group is scored while others of its
batch are still generating: tests/test_stream_pipeline.py). A dead engine's groups are sent again
to its replacement.
"""

from __future__ import annotations

from contextlib import closing
from pathlib import Path

import pytest

from grpo_dist.config import load_config

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[1]
VARIES = ("timing/", "perf/", "sync/seconds", "train/logprob_diff_behaviour_")  # as in test_reproducibility


@pytest.fixture(scope="module")
def ray_cluster():
    from grpo_dist.cluster.ray_utils import shutdown_ray

    yield
    shutdown_ray()


def run(model_dir, out, streaming: bool, k: int, steps: int = 3, workers: int = 1, evaluate: bool = False,
        cluster_restarts: int = 3, **rollout):
    """A short vLLM run; ``seen`` per step: (learner version before the update, per-sample
    versions, completion ids, behaviour log-probs)."""
    from grpo_dist.trainer import Trainer

    class Recording(Trainer):
        def train_step(self):
            version = self.version
            m = super().train_step()
            b = self.last_batch
            self.seen.append((version, list(b.adapter_versions), b.completion_ids, b.behaviour_logprobs))
            return m

    cfg = load_config(ROOT / "configs/tiny_cpu.yaml", {
        "output_dir": str(out), "model": {"path": str(model_dir), "make_if_missing": None},
        "rollout": {"backend": "vllm", "num_workers": workers, "prompts_per_step": 4, "group_size": 4,
                    "streaming": streaming, **rollout},
        "learner": {"micro_batch_size": 16},
        "trainer": {"steps": steps, "seed": 0, "eval_before_after": evaluate, "max_staleness": k},
        "data": {"eval_size": 8},
        "checkpoint": {"every": 0}, "logging": {"wandb_mode": "disabled", "progress": False},
        "cluster": {"max_restarts": cluster_restarts}})
    with closing(Recording(cfg)) as t:
        t.seen = []
        t.setup()
        t.run()
    return t


def steady(history):
    """Per-step metrics without clocks and the batch-composition-dependent log-prob diagnostics."""
    return [{k: v for k, v in h.items() if not k.startswith(VARIES)} for h in history]


def test_streaming_with_k0_is_the_batch_run(ray_cluster, pretrained_model_dir, tmp_path):
    a = run(pretrained_model_dir, tmp_path / "batch", False, 0)
    b = run(pretrained_model_dir, tmp_path / "stream", True, 0)
    assert b.trained_prompt_ids == a.trained_prompt_ids and len(a.trained_prompt_ids) == 12
    assert [s[2] for s in b.seen] == [s[2] for s in a.seen]  # the same tokens every step
    assert steady(b.history) == steady(a.history)  # the same rewards, advantages, losses, updates
    diff = max(abs(x - y) for sa, sb in zip(a.seen, b.seen) for ra, rb in zip(sa[3], sb[3]) for x, y in zip(ra, rb))
    print(f"max |behaviour log-prob difference| batch vs streaming: {diff:.2e}")
    assert diff < 1e-4
    assert all(h["rollout/staleness_max"] == 0.0 for h in b.history)
    assert [len(x["scored"]) for x in b.pipeline.timeline] == [4, 4, 4]


@pytest.mark.parametrize("k", [1, 2])
def test_streaming_staleness_buffer_and_early_scores(k, ray_cluster, pretrained_model_dir, tmp_path):
    t = run(pretrained_model_dir, tmp_path, True, k, steps=5, workers=k, evaluate=k == 1,
            adapter_mode="merged" if k == 1 else "lora")
    p = t.pipeline
    if k == 1:  # evaluation (sampled and greedy) through the async actors' generate
        assert t._before["num_prompts"] == 8 and "greedy_mean_reward" in t._before
    for learner_version, versions, _, _ in t.seen:
        assert len(versions) == 16 and all(isinstance(v, int) for v in versions)
        assert all(0 <= learner_version - v <= k for v in versions)
    assert max(h["rollout/staleness_max"] for h in t.history) == float(k)  # the pipeline filled up
    assert [h["sync/version"] for h in t.history] == [1.0, 2.0, 3.0, 4.0, 5.0]
    assert len(t.trained_prompt_ids) == len(set(t.trained_prompt_ids)) == 20  # each prompt trained once
    assert t.stream.state_dict()["index"] == 20 and not p.queue and not p.loads
    assert p.capacity == 4 * (k + 1) and 0 < p.buffer_peak <= p.capacity
    # Each group is scored after it finished generating. Whether some group of a batch is scored
    # before its batch's last group finishes depends on timing here (a tiny model's groups finish
    # within milliseconds of each other; a CI run saw none in 5 batches): printed, not asserted.
    # tests/test_stream_pipeline.py shows it with an engine whose timing is known.
    assert all(s >= g for x in p.timeline for g, s in zip(x["generated"], x["scored"]))
    early = [sum(s < max(x["generated"]) for s in x["scored"]) for x in p.timeline]
    print(f"k={k}: groups scored before their batch's last group finished, per batch: {early}; "
          f"engines per group: {[x['ranks'] for x in p.timeline]}")
    if k == 2:  # both engines take groups (per batch it depends on what each still holds:
        # dispatch by outstanding work is shown with known timings in tests/test_stream_pipeline.py)
        assert {r for x in p.timeline for r in x["ranks"]} == {0, 1}


def test_a_dead_engine_with_queued_groups_is_replaced_and_they_are_sent_again(
        ray_cluster, pretrained_model_dir, tmp_path, monkeypatch):
    """k = 2, two engines: engine 1 is killed after step 1, with groups of steps 2 and 3 on it. It
    is replaced once, its groups are sent again (same seed keys) and scored; every prompt is
    trained once and no sample is more than 2 versions behind."""
    import ray

    from grpo_dist.cluster.stream import StreamPipeline
    from grpo_dist.trainer import Trainer

    sent = []
    original, step_fn = StreamPipeline._send, Trainer.train_step

    def spy(self, p, i, rank):
        sent.append((p.step, i, rank, tuple(p.keys[i])))
        return original(self, p, i, rank)

    def train_step(self):
        if self.step == 1:
            ray.kill(self.workers.rollout.actors[1], no_restart=True)
        return step_fn(self)

    monkeypatch.setattr(StreamPipeline, "_send", spy)
    monkeypatch.setattr(Trainer, "train_step", train_step)  # undone when the test ends
    t = run(pretrained_model_dir, tmp_path, True, 2, steps=3, workers=2, cluster_restarts=1)
    assert t.history[-1]["cluster/restarts"] == 1.0
    first, again = {}, []
    for step, i, rank, key in sent:
        if (step, i) in first:
            again.append((step, i))
            assert first[(step, i)] == key  # the same prompt, the same sampling-seed key
        first.setdefault((step, i), key)
    assert again and all(step in (2, 3) for step, _ in again)
    assert len(t.trained_prompt_ids) == len(set(t.trained_prompt_ids)) == 12
    assert all(max(lv - v for v in vs) <= 2 for lv, vs, _, _ in t.seen)
