"""trainer.max_staleness end to end (local Ray, transformers rollout backend, DeepSpeed learner).

k = 0 is the synchronous run, identical to the default; k = 1, 2 generate ahead and no sample
the learner trains on is more than k versions older than the learner (checked per sample,
against the learner's version at training time); a k = 2 run resumed from a checkpoint taken
while two batches were pending generates exactly those prompts again.
"""

from __future__ import annotations

import json

import pytest

import e2e

pytestmark = pytest.mark.slow


def run(model_dir, out, trainer: dict, steps: int = 3, workers: int = 1, before_step=None, **sections):
    """A short run through the driver; returns (the closed run, its Recorder: per step the learner
    version before the update, per-sample adapter versions, completion ids, prompt ids)."""
    rec = e2e.Recorder(before_step)
    cfg = e2e.config(model_dir, out, workers=workers, steps=steps, learner={"micro_batch_size": 16},
                     trainer={"steps": steps, "eval_before_after": False, **trainer}, **sections)
    t, _ = e2e.train_run(cfg, rec)
    t.rec = rec
    return t


def test_max_staleness_0_is_the_default_synchronous_run(ray_cluster, pretrained_model_dir, tmp_path):
    """On CPU ``trainer.max_staleness: auto`` resolves to 0: the default config is the k = 0 run
    (so one run of it shows both); every batch is generated on-policy, right before its update."""
    default = e2e.config(pretrained_model_dir, tmp_path)
    k0 = e2e.config(pretrained_model_dir, tmp_path, trainer={"max_staleness": 0, "eval_before_after": False})
    assert default.model_dump() == k0.model_dump()
    b = run(pretrained_model_dir, tmp_path / "k0", {"max_staleness": 0})
    assert b.cfg.trainer.max_staleness == 0 and not b.cfg.trainer.async_rollouts
    assert len(b.history) == 3 and [s["learner_version"] for s in b.rec.steps] == [0, 1, 2]
    assert all(h["rollout/staleness_max"] == 0.0 and h["rollout/staleness_count/0"] == 16 for h in b.history)
    assert all("timing/generate" in h and "timing/generate_wait" not in h for h in b.history)


@pytest.mark.parametrize("k", [pytest.param(1, marks=pytest.mark.heavy), 2])  # k 1 (one engine): make test-all
def test_staleness_never_exceeds_k(k, ray_cluster, pretrained_model_dir, tmp_path):
    """k = 1: one engine; k = 2: two engines fed in chunks of one prompt (dispatch by outstanding
    work). Per sample: learner version - sample version <= k, and exactly k once the pipeline is
    full; the prompts are trained once each, in stream order."""
    t = run(pretrained_model_dir, tmp_path, {"max_staleness": k, "dispatch_chunk": 1 if k == 2 else 0},
            steps=5, workers=1 if k == 1 else 2)
    assert t.cfg.trainer.async_rollouts  # the learner uses the behaviour log-probs as pi_old
    per_step = []
    for s in t.rec.steps:
        stale = [s["learner_version"] - v for v in s["versions"]]
        assert 0 <= min(stale) and max(stale) <= k
        per_step.append(sorted(set(stale)))
    assert per_step == [[0], [1]] + [[k]] * 3
    assert [h["rollout/staleness_max"] for h in t.history] == [0.0, 1.0] + [float(k)] * 3
    assert [h[f"rollout/staleness_count/{k}"] for h in t.history[2:]] == [16.0] * 3
    assert [h["sync/version"] for h in t.history] == [1.0, 2.0, 3.0, 4.0, 5.0]
    assert ["timing/generate" in h for h in t.history] == [True] + [False] * 4  # then taken from the queue
    assert all("timing/generate_wait" in h for h in t.history[1:])
    ids = t.rec.prompt_ids
    assert len(ids) == len(set(ids)) == 20  # every prompt trained once
    assert t.rollouts.stream.state_dict()["index"] == 20  # nothing drawn past the last step
    assert not t.rollouts.pipeline.queue and not t.sync.loads  # nothing left in flight


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
    before, after = full.rec.prompt_ids[:8], resumed.rec.prompt_ids
    assert len(after) == 8 and after == full.rec.prompt_ids[8:]
    assert sorted(before + after) == sorted(set(before + after)) == sorted(full.rec.prompt_ids)
    # the first resumed batch is generated on-policy by the restored version 2, then 1 and 2 behind
    assert [sorted(set(s["versions"])) for s in resumed.rec.steps] == [[2], [2]]
    assert [s["learner_version"] for s in resumed.rec.steps] == [2, 3]


def test_a_dead_engine_with_queued_chunks_is_replaced_and_they_are_sent_again(
        ray_cluster, pretrained_model_dir, tmp_path):
    """k = 2, two engines, chunks of one prompt: engine 1 is killed after step 1, while the
    batches of steps 2 and 3 are queued on both engines. It is replaced once; its chunks are sent
    again with the same prompts and seed keys; every prompt is trained once, in stream order, and
    no sample is more than 2 versions behind."""
    import ray

    from grpo_dist.orchestrator.pipeline import RolloutPipeline

    sent = []
    original = RolloutPipeline._send

    def spy(self, p, lo, hi, rank):
        sent.append((p.step, lo, hi, rank, tuple(map(tuple, p.keys[lo:hi]))))
        return original(self, p, lo, hi, rank)

    def kill_engine_1(run, step):  # before step 2: the batches of steps 2 and 3 are queued on both engines
        if step == 2:
            ray.kill(run.workers.rollout.actors[1], no_restart=True)

    mp = pytest.MonkeyPatch()
    mp.setattr(RolloutPipeline, "_send", spy)
    try:
        t = run(pretrained_model_dir, tmp_path, {"max_staleness": 2, "dispatch_chunk": 1}, steps=3, workers=2,
                before_step=kill_engine_1, cluster={"max_restarts": 1})
    finally:
        mp.undo()
    assert t.history[-1]["cluster/restarts"] == 1.0
    first = {}
    again = []
    for step, lo, hi, _rank, keys in sent:
        if (step, lo) in first:
            again.append((step, lo))
            assert first[(step, lo)] == (hi, keys)  # the same prompts, the same sampling-seed keys
        first.setdefault((step, lo), (hi, keys))
    assert again and all(step in (2, 3) for step, _ in again)
    assert len(t.rec.prompt_ids) == len(set(t.rec.prompt_ids)) == 12
    assert all(max(s["learner_version"] - v for v in s["versions"]) <= 2 for s in t.rec.steps)


def test_an_engine_outside_the_actor_killed_and_killed_again_while_its_replacement_starts(
        ray_cluster, pretrained_model_dir, tmp_path, caplog):
    """``rollout.engine_in_process: false`` (the GPU default: vLLM's engine core and its CPU worker
    are processes outside the rollout actor's), one vLLM engine, 2 steps. Before step 2 the engine
    core is SIGKILLed and the reward actor killed; the replacement's engine core is SIGKILLed too,
    2 s after it appears (its start fails: the engine process lost, replaced again within the same
    budget). 3 replacements; step 2 trains on 16 fresh completions of its own prompts."""
    import os
    import signal
    import threading
    import time

    import ray

    hit, errors = {}, []

    def kill_next_start(run, old):  # the replacement's engine core, while its engine starts
        try:
            deadline = time.monotonic() + 600
            while run.workers.rollout.actors[0] is old and time.monotonic() < deadline:
                time.sleep(0.1)
            new = run.workers.rollout.actors[0]
            while time.monotonic() < deadline:
                core = e2e.engine_processes(new, "VLLM::EngineCore")
                if core:
                    time.sleep(2)  # as the OOM killer would: not in its first instant (StartWatch looks every 0.1 s)
                    os.kill(core[0].pid, signal.SIGKILL)
                    hit["starting"] = core[0].pid
                    return
                time.sleep(0.1)
            errors.append("no replacement engine core within 600 s")
        except Exception as e:  # reported by the test
            errors.append(repr(e))

    def fault(run, step):
        if step == 2:
            engine = run.workers.rollout.actors[0]
            core = e2e.engine_processes(engine, "VLLM::EngineCore")[0]
            watcher = threading.Thread(target=kill_next_start, args=(run, engine), daemon=True)
            watcher.start()
            hit["watcher"] = watcher
            os.kill(core.pid, signal.SIGKILL)
            hit["core"] = core.pid
            ray.kill(run.workers.reward.actors[0], no_restart=True)

    with caplog.at_level("WARNING", logger="grpo_dist.cluster"):
        t = run(pretrained_model_dir, tmp_path, {}, steps=2, before_step=fault,
                rollout={"backend": "vllm", "engine_in_process": False, "max_tokens": 6}, cluster={"max_restarts": 3})
    hit["watcher"].join(10)
    assert not errors and hit.keys() == {"watcher", "core", "starting"}, errors
    replaced = [r.getMessage() for r in caplog.records if "replacing it" in r.getMessage()]
    print("\n".join(["", *replaced]))
    assert len(replaced) == 3 and t.history[-1]["cluster/restarts"] == 3.0, replaced
    # the running engine's core: found by vLLM's own error or by the heartbeat, whichever first
    assert replaced[0].startswith("rollout worker 0: engine ") and (
        "dead" in replaced[0] or f"(pid {hit['core']})" in replaced[0]), replaced
    # the starting one's: its start fails naming the lost process itself (StartWatch, EngineProcessLost: not
    # only found by a heartbeat after the error), and the actor is replaced again within the same budget
    assert replaced[1].startswith(f"rollout worker 0: engine dead: engine process VLLM::EngineCore (pid "
                                  f"{hit['starting']}) ") and "while the engine started" in replaced[1], replaced
    assert replaced[2].startswith("reward worker 0 died"), replaced
    assert [h["rollout/num_completions"] for h in t.history] == [16.0, 16.0]
    assert len(t.rec.prompt_ids) == len(set(t.rec.prompt_ids)) == 8
    assert [sorted(set(s["versions"])) for s in t.rec.steps] == [[0], [1]]  # the replacement serves version 1
