"""rollout.streaming end to end (local Ray, vLLM CPU async engines, DeepSpeed learner).

k = 0: the streaming run trains the same prompts on the same tokens with the same rewards and
losses as the batch pipeline (per-sample seeds). k = 1 (one engine, merged serving: loads drain
the engine) and k = 2 (two engines, LoRA serving: versions coexist): no sample is more than k
versions behind the learner, every sample carries its version, the buffer stays within its
bound (that a group is scored while others of its batch are still generating:
tests/test_stream_pipeline.py). A dead engine's groups are sent again to its replacement.
"""

from __future__ import annotations

import e2e
import pytest

pytestmark = pytest.mark.slow
VARIES = ("timing/", "perf/", "sync/seconds", "train/logprob_diff_behaviour_")  # as in test_reproducibility
STREAM_ONLY = ("rollout/groups_", "rollout/score_lag_s", "rollout/engines_used",  # what the streaming pipeline saw
               "rollout/inflight_", "rollout/mixed_version_frac", "rollout/token_staleness_")


def run(model_dir, out, streaming: bool, k: int, steps: int = 3, workers: int = 1, evaluate: bool = False,
        cluster_restarts: int = 3, before_step=None, **rollout):
    """A short vLLM run through the driver; ``t.rec`` (an ``e2e.Recorder``) holds each step's batch."""
    rec = e2e.Recorder(before_step)
    cfg = e2e.config(model_dir, out, workers=workers, steps=steps,
                     rollout={"backend": "vllm", "streaming": streaming, "max_tokens": 6, **rollout},
                     learner={"micro_batch_size": 16},
                     trainer={"steps": steps, "seed": 0, "eval_before_after": evaluate, "max_staleness": k},
                     data={"eval_size": 8}, cluster={"max_restarts": cluster_restarts})
    t, _ = e2e.train_run(cfg, rec)
    t.rec = rec
    return t


def steady(history):
    """Per-step metrics without clocks and the batch-composition-dependent log-prob diagnostics."""
    return [{k: v for k, v in h.items() if not k.startswith(VARIES + STREAM_ONLY)} for h in history]


@pytest.mark.heavy  # make test-all: streaming with k 1 (below) and the streaming engines' collective load are in make test
def test_streaming_with_k0_is_the_batch_run(ray_cluster, pretrained_model_dir, tmp_path):
    a = run(pretrained_model_dir, tmp_path / "batch", False, 0)
    b = run(pretrained_model_dir, tmp_path / "stream", True, 0, inflight_updates=True)  # k 0: no load finds one running
    assert b.rec.prompt_ids == a.rec.prompt_ids and len(a.rec.prompt_ids) == 12
    assert all(h["rollout/mixed_version_frac"] == 0.0 and h["rollout/inflight_updates"] == 0.0 for h in b.history)
    same = [sb["completion_ids"] == sa["completion_ids"] for sa, sb in zip(a.rec.steps, b.rec.steps)]
    assert same == [True] * 3  # the same tokens every step
    assert steady(b.history) == steady(a.history)  # the same rewards, advantages, losses, updates
    diff = max(abs(x - y) for sa, sb in zip(a.rec.steps, b.rec.steps)
               for ra, rb in zip(sa["logprobs"], sb["logprobs"]) for x, y in zip(ra, rb))
    print(f"max |behaviour log-prob difference| batch vs streaming: {diff:.2e}")
    assert diff < 1e-4
    assert all(h["rollout/staleness_max"] == 0.0 for h in b.history)
    assert all(h["rollout/groups_on_engine/0"] == 4.0 for h in b.history)  # one engine, 4 groups per batch


@pytest.mark.parametrize("k", [1, pytest.param(2, marks=pytest.mark.heavy)])  # k 2: make test-all (k 2's dispatch: test_pipeline_e2e)
def test_streaming_staleness_buffer_and_early_scores(k, ray_cluster, pretrained_model_dir, tmp_path):
    t = run(pretrained_model_dir, tmp_path, True, k, steps=5, workers=k, evaluate=k == 1,
            **(dict(adapter_mode="merged", inflight_updates=True) if k == 1 else dict(adapter_mode="lora")))
    p = t.rollouts.pipeline
    if k == 1:  # evaluation (sampled and greedy) through the async actors' generate
        assert t.before["num_prompts"] == 8 and "greedy_mean_reward" in t.before
    for s in t.rec.steps:
        assert len(s["versions"]) == 16 and all(isinstance(v, int) for v in s["versions"])
        assert all(0 <= s["learner_version"] - v <= k for v in s["versions"])
    assert max(h["rollout/staleness_max"] for h in t.history) == float(k)  # the pipeline filled up
    assert [h["sync/version"] for h in t.history] == [1.0, 2.0, 3.0, 4.0, 5.0]
    assert len(t.rec.prompt_ids) == len(set(t.rec.prompt_ids)) == 20  # each prompt trained once
    assert t.rollouts.stream.state_dict()["index"] == 20 and not t.rollouts.pipeline.queue and not t.sync.loads
    assert p.capacity == 4 * (k + 1) and 0 < p.buffer_peak <= p.capacity
    if k == 1:  # in-flight loads (merged weights): every token within k of the learner, each load recorded
        assert all(0.0 <= h["rollout/token_staleness_max"] <= k and 0.0 <= h["rollout/mixed_version_frac"] <= 1.0
                   for h in t.history)
        assert sum(h["rollout/inflight_loads"] for h in t.history) >= 3  # versions 1-3 at least, seen by step 5
    # Whether a group is scored before its batch's last group finishes depends on timing here (a
    # tiny model's groups finish within milliseconds of each other): printed, not asserted;
    # tests/test_stream_pipeline.py shows it with an engine whose timing is known.
    print(f"k={k}: groups scored early per batch: {[h['rollout/groups_scored_early'] for h in t.history]}")
    if k == 2:  # both engines take groups (per batch it depends on what each still holds:
        # dispatch by outstanding work is shown with known timings in tests/test_stream_pipeline.py)
        assert all(sum(h.get(f"rollout/groups_on_engine/{r}", 0.0) for h in t.history) > 0 for r in (0, 1))


@pytest.mark.heavy  # make test-all: a stopped engine's groups sent again and rescored: the next test, in make test
def test_a_dead_engine_with_queued_groups_is_replaced_and_they_are_sent_again(
        ray_cluster, pretrained_model_dir, tmp_path, monkeypatch):
    """k = 2, two engines: engine 1 is killed after step 1, with groups of steps 2 and 3 on it. It
    is replaced once, its groups are sent again (same seed keys) and scored; every prompt is
    trained once and no sample is more than 2 versions behind."""
    import ray

    from grpo_dist.orchestrator.stream import StreamPipeline

    sent = []
    original = StreamPipeline._send

    def spy(self, p, i, rank):
        sent.append((p.step, i, rank, tuple(p.keys[i])))
        return original(self, p, i, rank)

    def kill_engine_1(run, step):  # before step 2: groups of steps 2 and 3 are on it
        if step == 2:
            ray.kill(run.workers.rollout.actors[1], no_restart=True)

    monkeypatch.setattr(StreamPipeline, "_send", spy)  # undone when the test ends
    t = run(pretrained_model_dir, tmp_path, True, 2, steps=3, workers=2, cluster_restarts=1, before_step=kill_engine_1)
    assert t.history[-1]["cluster/restarts"] == 1.0
    first, again = {}, []
    for step, i, _rank, key in sent:
        if (step, i) in first:
            again.append((step, i))
            assert first[(step, i)] == key  # the same prompt, the same sampling-seed key
        first.setdefault((step, i), key)
    assert again and all(step in (2, 3) for step, _ in again)
    assert len(t.rec.prompt_ids) == len(set(t.rec.prompt_ids)) == 12
    assert all(max(s["learner_version"] - v for v in s["versions"]) <= 2 for s in t.rec.steps)



def test_a_stopped_engine_and_a_dead_reward_actor_mid_stream(ray_cluster, pretrained_model_dir, tmp_path,
                                                             monkeypatch, caplog):
    """One streaming engine (vLLM's async engine: its core and CPU worker are processes outside the
    actor's), k = 0, 2 steps. Before step 2 the engine's CPU worker is SIGSTOPped (its heartbeat
    reports it stopped) and the reward actor killed. Both are replaced (2 restarts); the groups
    sent to the stopped engine are sent again with the same seed keys and scored by the new reward
    actor (the scores chained to the dead one asked again); every prompt is trained once on 16
    completions. (Two engines, k = 2, a killed actor: the heavy test above; an engine process
    killed, and killed again while its replacement starts: test_pipeline_e2e.py.)"""
    import os
    import signal

    import ray

    from grpo_dist.orchestrator.stream import StreamPipeline

    sent, scored, hit = [], [], {}
    send, score = StreamPipeline._send, StreamPipeline._score

    def spy_send(self, p, i, rank):
        sent.append((p.step, i, tuple(p.keys[i])))
        return send(self, p, i, rank)

    def spy_score(self, item):
        score(self, item)
        scored.append((item.gen.hex(), item.reward_actor))

    def fault(run, step):  # a stopped engine process (a debugger, SIGSTOP) and a dead reward actor
        if step == 2:
            worker = e2e.engine_processes(run.workers.rollout.actors[0], "VLLM::Worker")[0]
            os.kill(worker.pid, signal.SIGSTOP)
            hit["worker"] = worker.pid
            ray.kill(run.workers.reward.actors[0], no_restart=True)

    monkeypatch.setattr(StreamPipeline, "_send", spy_send)  # undone when the test ends
    monkeypatch.setattr(StreamPipeline, "_score", spy_score)
    try:
        with caplog.at_level("WARNING", logger="grpo_dist.cluster"):
            t = run(pretrained_model_dir, tmp_path, True, 0, steps=2, before_step=fault)
    finally:
        if "worker" in hit:  # the replacement killed it (kill_engine); never leave a stopped process behind
            try:
                os.kill(hit["worker"], signal.SIGKILL)
            except OSError:
                pass
    replaced = [r.getMessage() for r in caplog.records if "replacing it" in r.getMessage()]
    print("\n".join(["", *replaced]))
    assert len(replaced) == 2 and t.history[-1]["cluster/restarts"] == 2.0, replaced
    assert replaced[0].startswith(f"rollout worker 0: engine process VLLM::Worker (pid {hit['worker']}) stopped")
    assert replaced[1].startswith("reward worker 0 died"), replaced
    first, again = {}, []
    for step, i, key in sent:  # sent again: the same prompt, the same sampling-seed key
        if (step, i) in first:
            again.append(step)
            assert first[(step, i)] == key
        first.setdefault((step, i), key)
    assert again and set(again) == {2}, sent
    by_gen = {}
    for gen, actor in scored:  # scored again: a generation's score asked of the new reward actor
        by_gen.setdefault(gen, []).append(actor)
    assert any(len(a) > 1 and a[-1] is not a[0] for a in by_gen.values()), scored
    assert len(t.rec.prompt_ids) == len(set(t.rec.prompt_ids)) == 8
    assert [h["rollout/num_completions"] for h in t.history] == [16.0, 16.0]
    assert [sorted(set(s["versions"])) for s in t.rec.steps] == [[0], [1]]  # k = 0: on-policy, the replacement too
