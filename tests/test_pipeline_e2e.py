"""trainer.max_staleness end to end (local Ray, transformers rollout backend, DeepSpeed learner).

k = 0 is the synchronous run, identical to the default; k = 1, 2 generate ahead and no sample
the learner trains on is more than k versions older than the learner (checked per sample,
against the learner's version at training time); a k = 2 run resumed from a checkpoint taken
while two batches were pending generates exactly those prompts again.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from grpo_dist.config import load_config

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[1]
CLOCKS = ("timing/", "perf/", "sync/seconds")


@pytest.fixture(scope="module")
def ray_cluster():
    from grpo_dist.cluster.ray_utils import shutdown_ray

    yield
    shutdown_ray()


def run(model_dir, out, trainer: dict, steps: int = 3, workers: int = 1, **sections):
    """A short run; returns the trainer (closed) with ``seen``: per step (learner version before
    the update, per-sample adapter versions, completion ids, prompt ids)."""
    from grpo_dist.trainer import Trainer

    class Recording(Trainer):
        def train_step(self):
            version = self.version
            m = super().train_step()
            b = self.last_batch
            self.seen.append((version, list(b.adapter_versions), b.completion_ids,
                              [g.prompt_id for g in self._last_samples[0]]))
            return m

    base = {
        "output_dir": str(out), "model": {"path": str(model_dir), "make_if_missing": None},
        "rollout": {"backend": "hf", "num_workers": workers, "prompts_per_step": 4, "group_size": 4, "max_tokens": 5},
        "learner": {"micro_batch_size": 16}, "trainer": {"steps": steps, "eval_before_after": False, **trainer},
        "checkpoint": {"every": 0}, "logging": {"wandb_mode": "disabled", "progress": False},
    }
    for k, v in sections.items():
        base.setdefault(k, {}).update(v)
    t = Recording(load_config(ROOT / "configs/tiny_cpu.yaml", base))
    t.seen = []
    try:
        t.setup()
        t.run()
    finally:
        t.close()
    return t


def steady(history):
    return [{k: v for k, v in h.items() if not k.startswith(CLOCKS)} for h in history]


def test_max_staleness_0_is_the_default_synchronous_run(ray_cluster, pretrained_model_dir, tmp_path):
    a = run(pretrained_model_dir, tmp_path / "default", {})
    b = run(pretrained_model_dir, tmp_path / "k0", {"max_staleness": 0})
    assert b.cfg.trainer.max_staleness == 0 and not b.cfg.trainer.async_rollouts
    assert steady(a.history) == steady(b.history) and len(a.history) == 3
    assert [s[2] for s in a.seen] == [s[2] for s in b.seen]  # the same tokens every step
    assert all(h["rollout/staleness_max"] == 0.0 and h["rollout/staleness_count/0"] == 16 for h in a.history)
    assert all("timing/generate" in h and "timing/generate_wait" not in h for h in a.history)


@pytest.mark.parametrize("k", [1, 2])
def test_staleness_never_exceeds_k(k, ray_cluster, pretrained_model_dir, tmp_path):
    """k = 1: one engine; k = 2: two engines fed in chunks of one prompt (dispatch by outstanding
    work). Per sample: learner version - sample version <= k, and exactly k once the pipeline is
    full; the prompts are trained once each, in stream order."""
    t = run(pretrained_model_dir, tmp_path, {"max_staleness": k, "dispatch_chunk": 1 if k == 2 else 0},
            steps=5, workers=1 if k == 1 else 2)
    assert t.cfg.trainer.async_rollouts  # the learner uses the behaviour log-probs as pi_old
    per_step = []
    for learner_version, versions, _, _ in t.seen:
        stale = [learner_version - v for v in versions]
        assert 0 <= min(stale) and max(stale) <= k
        per_step.append(sorted(set(stale)))
    assert per_step == [[0], [1]] + [[k]] * 3
    assert [h["rollout/staleness_max"] for h in t.history] == [0.0, 1.0] + [float(k)] * 3
    assert [h[f"rollout/staleness_count/{k}"] for h in t.history[2:]] == [16.0] * 3
    assert [h["sync/version"] for h in t.history] == [1.0, 2.0, 3.0, 4.0, 5.0]
    assert ["timing/generate" in h for h in t.history] == [True] + [False] * 4  # then taken from the queue
    assert all("timing/generate_wait" in h for h in t.history[1:])
    ids = [i for s in t.seen for i in s[3]]
    assert ids == t.trained_prompt_ids and len(ids) == 20
    assert t.stream.state_dict()["index"] == 20  # nothing drawn past the last step
    assert not t.pipeline.queue and not t.pipeline.loads  # nothing left in flight


def test_resume_with_k2_regenerates_exactly_the_prompts_not_trained_on(ray_cluster, pretrained_model_dir, tmp_path):
    """k = 2, checkpoint after step 2 while the batches of steps 3 and 4 were generating: the
    checkpoint's stream position is before them, and the resumed run trains exactly those 8
    prompts (with the same seed keys): none lost, none trained twice."""
    full = run(pretrained_model_dir, tmp_path / "a", {"max_staleness": 2}, steps=4,
               checkpoint={"every": 2})
    state = json.loads((tmp_path / "a" / "checkpoints" / "step_000002" / "trainer_state.json").read_text())
    assert state["data"]["index"] == 2 * 4  # 4 batches drawn by then, 2 trained
    resumed = run(pretrained_model_dir, tmp_path / "a", {"max_staleness": 2}, steps=4,
                  checkpoint={"every": 0, "resume": str(tmp_path / "a" / "checkpoints" / "step_000002")})
    before, after = full.trained_prompt_ids[:8], resumed.trained_prompt_ids
    assert len(after) == 8 and after == full.trained_prompt_ids[8:]
    assert sorted(before + after) == sorted(set(before + after)) == sorted(full.trained_prompt_ids)
    # the first resumed batch is generated on-policy by the restored version 2, then 1 and 2 behind
    assert [sorted(set(v)) for _, v, _, _ in resumed.seen] == [[2], [2]]
    assert [s[0] for s in resumed.seen] == [2, 3]


def test_a_dead_engine_with_queued_chunks_is_replaced_and_they_are_sent_again(
        ray_cluster, pretrained_model_dir, tmp_path):
    """k = 2, two engines, chunks of one prompt: engine 1 is killed after step 1, while the
    batches of steps 2 and 3 are queued on both engines. It is replaced once; its chunks are sent
    again with the same prompts and seed keys; every prompt is trained once, in stream order, and
    no sample is more than 2 versions behind."""
    import ray

    from grpo_dist.cluster.pipeline import RolloutPipeline

    sent = []
    original = RolloutPipeline._send

    def spy(self, p, lo, hi, rank):
        sent.append((p.step, lo, hi, rank, tuple(map(tuple, p.keys[lo:hi]))))
        return original(self, p, lo, hi, rank)

    from grpo_dist.trainer import Trainer

    kill = Trainer.train_step

    def train_step(self):
        if self.step == 1:
            ray.kill(self.workers.rollout.actors[1], no_restart=True)
        return kill(self)

    mp = pytest.MonkeyPatch()
    mp.setattr(RolloutPipeline, "_send", spy)
    mp.setattr(Trainer, "train_step", train_step)
    try:
        t = run(pretrained_model_dir, tmp_path, {"max_staleness": 2, "dispatch_chunk": 1}, steps=3, workers=2,
                cluster={"max_restarts": 1})
    finally:
        mp.undo()
    assert t.history[-1]["cluster/restarts"] == 1.0
    first = {}
    again = []
    for step, lo, hi, rank, keys in sent:
        if (step, lo) in first:
            again.append((step, lo))
            assert first[(step, lo)] == (hi, keys)  # the same prompts, the same sampling-seed keys
        first.setdefault((step, lo), (hi, keys))
    assert again and all(step in (2, 3) for step, _ in again)
    assert t.trained_prompt_ids == [i for s in t.seen for i in s[3]] and len(t.trained_prompt_ids) == 12
    assert all(max(lv - v for v in vs) <= 2 for lv, vs, _, _ in t.seen)
