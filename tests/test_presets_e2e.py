"""The algorithm's options end to end (Ray, rollout + reward + DeepSpeed learner actors): the grpo
preset's train/loss equals grpo_dist.algo called directly on the same batch (every preset is
checked in-process by tests/test_presets.py); dynamic sampling never trains on a zero-spread
group and stops at its bound; reference refresh; async rollouts; full fine-tuning; both adapter
modes; the filesystem transport; dead, hung and NaN-producing actors.

The transformers rollout backend keeps each run to seconds (vLLM where the engine matters);
one local Ray cluster serves every run of the module.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from grpo_dist.algo import grpo_loss
import e2e
from test_presets import direct_loss
from grpo_dist.config.presets import PRESETS
from grpo_dist.testing.learner import loss_inputs, set_lr
from grpo_dist.testing.rollout import hang_next_generate, stored_versions

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[1]


def run_trainer(model_dir, out, overrides, recorder=None, keep=True):
    """A short run through the driver (``e2e.overrides`` updated by ``overrides``); the run is
    left open for the test to inspect (the caller closes it)."""
    run, _ = e2e.train_run(e2e.config(model_dir, out, **overrides), recorder, keep=keep)
    return run


def test_grpo_preset_end_to_end_matches_algo(ray_cluster, pretrained_model_dir, tmp_path):
    """The default preset through the whole pipeline: the learner actor's loss on the last batch
    equals grpo_dist.algo on the tensors it saw (every preset: tests/test_presets.py, in-process)."""
    import ray

    preset, rec = "grpo", e2e.Recorder()
    trainer = run_trainer(pretrained_model_dir, tmp_path, {"algo": {"preset": preset}}, rec)
    try:
        assert trainer.step == 2 and len(trainer.history) == 2
        for k, v in PRESETS[preset].items():
            assert getattr(trainer.cfg.algo, k) == v
        learner = trainer.workers.learner.actors[0]
        batch = rec.last_batch
        tensors = ray.get(learner.debug_call.remote(loss_inputs, batch))
        metrics = ray.get(learner.train_step.remote(batch))  # same weights: the loss before the update
        expected = direct_loss(trainer.cfg, tensors)
        assert metrics["train/loss"] == pytest.approx(expected, abs=1e-5, rel=1e-4), preset
    finally:
        trainer.close()


def test_dynamic_sampling_skips_zero_spread_groups_and_is_bounded(ray_cluster, pretrained_model_dir, tmp_path):
    trainer = run_trainer(pretrained_model_dir, tmp_path, {
        "algo": {"preset": "dapo", "max_sampling_rounds": 2}, "trainer": {"steps": 4, "eval_before_after": False}})
    try:
        for h in trainer.history:
            assert 0 <= h["rollout/sampling_rounds"] <= 2
            assert 0 < h["rollout/pass_rate"] <= 1
            if h["rollout/sampling_rounds"] < 2:  # the bound was not hit: every kept group has signal
                assert h["rollout/frac_reward_zero_std"] == 0.0
        # every step still trains on exactly prompts_per_step groups
        assert all(h["rollout/num_completions"] == 16 for h in trainer.history)
    finally:
        trainer.close()


@pytest.mark.heavy  # make test-all: dynamic sampling's bound is in make test (the test above)
def test_dynamic_sampling_with_zero_extra_rounds_keeps_everything(ray_cluster, pretrained_model_dir, tmp_path):
    """max_sampling_rounds 0: one generation round per step and every group trained on, even when
    every group has zero spread (a constant reward): nothing is dropped, nothing refilled."""
    trainer = run_trainer(pretrained_model_dir, tmp_path, {
        "algo": {"preset": "dapo", "max_sampling_rounds": 0},
        "reward": {"functions": [{"fn": "pattern", "kwargs": {"regex": ""}}]}})  # "" matches anything: 1.0
    try:
        assert len(trainer.history) == 2
        for h in trainer.history:
            assert h["rollout/sampling_rounds"] == 0 and h["rollout/pass_rate"] == 1.0
            assert h["rollout/frac_reward_zero_std"] == 1.0 and h["reward/pattern"] == 1.0  # all zero-spread ...
            assert h["rollout/num_completions"] == 16  # ... and all kept
        assert trainer.rollouts.stream.state_dict()["index"] == 2 * 4  # one round of 4 prompts per step, no refills
    finally:
        trainer.close()


def test_reference_refresh_every_k_steps(ray_cluster, pretrained_model_dir, tmp_path):
    """algo.ref_refresh_every: 2 with mix 1: the step after a refresh starts from policy ==
    reference (KL 0), the step before it does not; the counter goes up on steps 2 and 4."""
    trainer = run_trainer(pretrained_model_dir, tmp_path, {
        "algo": {"ref_refresh_every": 2}, "trainer": {"steps": 4, "eval_before_after": False}})
    try:
        h = trainer.history
        assert [x["train/ref_refreshes"] for x in h] == [0.0, 1.0, 1.0, 2.0]
        assert h[0]["train/kl"] == pytest.approx(0.0, abs=1e-9)  # step 1: policy == base == reference
        assert h[1]["train/kl"] > 1e-7  # step 2: the policy moved away from the base
        assert h[2]["train/kl"] == pytest.approx(0.0, abs=1e-9)  # step 3: reference refreshed after step 2
        assert all("timing/ref_refresh" in h[i] for i in (1, 3)) and "timing/ref_refresh" not in h[2]
    finally:
        trainer.close()


def test_async_rollouts_overlap_the_update_and_correct_with_the_behaviour_logprobs(
        ray_cluster, pretrained_model_dir, tmp_path):
    """trainer.async_rollouts: from step 2 on, every batch was generated by the previous version
    (staleness 1) during the previous update; the learner's loss uses the engine's log-probs as
    pi_old (checked against grpo_loss called directly); a checkpoint resumes before prompts that
    were generated but not trained on."""
    import json

    import ray

    rec = e2e.Recorder()
    trainer = run_trainer(pretrained_model_dir, tmp_path, {
        "trainer": {"steps": 4, "async_rollouts": True}, "checkpoint": {"every": 2}}, rec)
    try:
        h = trainer.history
        assert trainer.cfg.trainer.max_staleness == 1  # async_rollouts: the alias of one step ahead
        assert [x["rollout/staleness"] for x in h] == [0.0, 1.0, 1.0, 1.0]
        assert ["timing/generate_wait" in x for x in h] == [False, True, True, True]  # taken from the queue
        assert ["timing/generate" in x for x in h] == [True, False, False, False]
        assert h[0]["train/logprob_diff_behaviour_max"] < 1e-4  # on-policy first step
        assert all(x["train/logprob_diff_behaviour_max"] > 1e-3 for x in h[1:])  # one update behind
        assert [x["sync/version"] for x in h] == [1.0, 2.0, 3.0, 4.0]
        timing = json.loads((tmp_path / "summary.json").read_text())["mean_timing"]
        assert timing["timing/generate_wait"] == pytest.approx(sum(x["timing/generate_wait"] for x in h[1:]) / 3)

        state = json.loads((tmp_path / "checkpoints" / "step_000002" / "trainer_state.json").read_text())
        assert state["data"]["epoch"] == 0 and state["data"]["index"] == 2 * 4  # 3 batches drawn, 2 trained

        learner = trainer.workers.learner.actors[0]
        batch = rec.last_batch  # generated by version 2, the learner is at 4
        assert set(batch.adapter_versions) == {2}
        t = ray.get(learner.debug_call.remote(loss_inputs, batch))
        metrics = ray.get(learner.train_step.remote(batch))
        a = trainer.cfg.algo
        behaviour = torch.zeros_like(t["logp"])
        for i, lp in enumerate(batch.behaviour_logprobs):
            behaviour[i, :len(lp)] = torch.tensor(lp, dtype=behaviour.dtype)
        expected, _ = grpo_loss(t["logp"].double(), behaviour.double(), t["ref_logp"].double(),
                                t["advantages"].double(), t["mask"], beta=a.beta, clip_low=a.clip_low,
                                clip_high=a.clip_high, kl_kind=a.kl_kind, agg=a.agg)
        on_policy, _ = grpo_loss(t["logp"].double(), t["logp"].double(), t["ref_logp"].double(),
                                 t["advantages"].double(), t["mask"], beta=a.beta, agg=a.agg)
        assert metrics["train/loss"] == pytest.approx(float(expected), abs=1e-5, rel=1e-4)
        assert abs(float(expected) - float(on_policy)) > 1e-5  # the ratio mattered
    finally:
        trainer.close()


def test_full_finetuning_through_vllm_reload_weights(ray_cluster, pretrained_model_dir, tmp_path):
    """lora.enabled: false end to end: the learner trains every weight, each sync carries the whole
    model (zero-copy through the object store) and the vLLM workers load it in place, no file
    written; afterwards vLLM samples from the trained weights (its log-probs match the learner's,
    which moved away from the base model's). A replaced engine that joins mid-run loads the newest
    version the same way before it generates."""
    import ray
    from transformers import AutoModelForCausalLM

    from grpo_dist.data import make_task
    from grpo_dist.types import TrainBatch

    trainer = run_trainer(pretrained_model_dir, tmp_path, {
        "lora": {"enabled": False}, "rollout": {"backend": "vllm"}, "learner": {"lr": 5e-3, "warmup_steps": 0},
        "cluster": {"max_restarts": 1}})
    try:
        w, h = trainer.workers, trainer.history
        assert [x["sync/version"] for x in h] == [1.0, 2.0]
        model_bytes = (Path(pretrained_model_dir) / "model.safetensors").stat().st_size
        assert all(x["sync/bytes"] >= 0.9 * model_bytes for x in h)  # the whole model travels
        assert h[1]["train/logprob_diff_behaviour_max"] < 1e-3  # step 2 sampled from version 1's weights

        groups = ray.get(w.rollout.actors[0].generate.remote(make_task("add", 4, seed=7, split="eval"), n=2))
        rollouts = [r for g in groups for r in g.rollouts]
        assert all(r.adapter_version == 2 for r in rollouts)
        batch = TrainBatch(prompt_ids=[r.prompt_ids for r in rollouts], completion_ids=[r.completion_ids for r in rollouts],
                           behaviour_logprobs=[r.logprobs for r in rollouts], advantages=[0.0] * len(rollouts))
        learner_lp = ray.get(w.learner.actors[0].compute_logprobs.remote(batch))
        base = AutoModelForCausalLM.from_pretrained(pretrained_model_dir, dtype=torch.float32).eval()
        to_learner, to_base = [], []
        with torch.no_grad():
            for r, lp in zip(rollouts, learner_lp):
                ids = torch.tensor([r.prompt_ids + r.completion_ids])
                logp = torch.log_softmax(base(ids).logits[0, :-1].float(), -1)  # temperature 1
                n = len(r.prompt_ids)
                base_lp = logp[n - 1:, :].gather(-1, ids[0, n:, None])[:, 0].tolist()
                to_learner += [abs(a - b) for a, b in zip(r.logprobs, lp)]
                to_base += [abs(a - b) for a, b in zip(r.logprobs, base_lp)]
        print(f"vLLM vs learner max {max(to_learner):.2e}, vLLM vs base max {max(to_base):.2e}")
        assert max(to_learner) < 1e-3 and max(to_base) > 1e-2
        assert ray.get(w.rollout.actors[0].debug_call.remote(stored_versions)) == ([], [])  # in place: no files

        old = w.rollout.actors[0]
        ray.kill(old, no_restart=True)  # replaced at the next dispatch; it loads version 2 before it generates
        m = e2e.more_steps(trainer)
        assert m["cluster/restarts"] == 1 and w.rollout.actors[0] is not old and m["sync/version"] == 3.0
        assert m["train/logprob_diff_behaviour_max"] < 1e-3  # the new engine sampled from version 2's weights
        assert ray.get(w.rollout.actors[0].debug_call.remote(stored_versions)) == ([], [])
    finally:
        trainer.close()


# merged (the CPU default: every vLLM run of make test serves merged versions) with a subset of targets: make test-all
@pytest.mark.parametrize("mode, targets", [("lora", None), pytest.param("merged", ["v_proj", "up_proj", "down_proj"],
                                                                         marks=pytest.mark.heavy)])
def test_vllm_serves_each_version_in_both_adapter_modes(ray_cluster, pretrained_model_dir, tmp_path, mode, targets):
    """rollout.adapter_mode on vLLM's CPU build: lora (the engine runs the adapter with its LoRA
    kernels; the default on GPUs) and merged (the worker merges it into the base and the engine
    reloads; the CPU default). Either way only the adapter travels, every step samples from the
    previous update's weights (behaviour vs learner log-probs ~1e-6), and the engine serves the
    trained version at the end, not the base. Merged, with LoRA on v, up and down only: the
    worker reloads whole vLLM layers (q, k, v stacked in qkv_proj; gate, up in gate_up_proj) and
    leaves the others alone; a slice left out of a stacked layer would be garbage."""
    import ray

    from grpo_dist.data import make_task
    from grpo_dist.types import TrainBatch

    trainer = run_trainer(pretrained_model_dir, tmp_path, {
        "rollout": {"backend": "vllm", "adapter_mode": mode}, "learner": {"lr": 1e-2, "warmup_steps": 0},
        **({"lora": {"target_modules": targets}} if targets else {})})
    try:
        w, h = trainer.workers, trainer.history
        assert [x["sync/version"] for x in h] == [1.0, 2.0]
        assert all(x["sync/bytes"] < 2_000_000 for x in h)  # the adapter, not the model
        assert all(x["train/logprob_diff_behaviour_max"] < 1e-3 for x in h)
        recs = make_task("add", 4, seed=7, split="eval")
        groups = ray.get(w.rollout.actors[0].generate.remote(recs, n=2))
        rollouts = [r for g in groups for r in g.rollouts]
        assert all(r.adapter_version == 2 for r in rollouts)
        batch = TrainBatch(prompt_ids=[r.prompt_ids for r in rollouts], completion_ids=[r.completion_ids for r in rollouts],
                           behaviour_logprobs=[r.logprobs for r in rollouts], advantages=[0.0] * len(rollouts))
        learner_lp = ray.get(w.learner.actors[0].compute_logprobs.remote(batch))
        diff = max(abs(a - b) for r, lp in zip(rollouts, learner_lp) for a, b in zip(r.logprobs, lp))
        from transformers import AutoModelForCausalLM

        base = AutoModelForCausalLM.from_pretrained(pretrained_model_dir, dtype=torch.float32).eval()
        base_diff = 0.0
        with torch.no_grad():
            for r in rollouts:
                ids = torch.tensor([r.prompt_ids + r.completion_ids])
                logp = torch.log_softmax(base(ids).logits[0, :-1].float(), -1)  # temperature 1
                n = len(r.prompt_ids)
                base_lp = logp[n - 1:, :].gather(-1, ids[0, n:, None])[:, 0].tolist()
                base_diff = max([base_diff] + [abs(a - b) for a, b in zip(r.logprobs, base_lp)])
        print(f"{mode}: vLLM vs learner max {diff:.2e}; vLLM vs base {base_diff:.2e}")
        assert diff < 1e-3
        assert base_diff > 1e-2  # the trained version is what the engine serves
    finally:
        trainer.close()


def test_filesystem_transport_carries_the_updates(ray_cluster, pretrained_model_dir, tmp_path):
    """sync.transport: filesystem -- the learner writes v<version>.pt under
    <cluster.shared_dir>/<run_id>/sync (the newest sync.keep_versions kept) and the workers load
    from there; a second run on the same shared dir gets its own directory."""
    import ray

    shared = tmp_path / "shared"
    runs = []
    for name in ("a", "b"):
        trainer = run_trainer(pretrained_model_dir, tmp_path / name, {
            "rollout": {"num_workers": 2}, "trainer": {"steps": 3 if name == "a" else 1},
            "sync": {"transport": "filesystem", "keep_versions": 2}, "cluster": {"shared_dir": str(shared)}})
        try:
            runs.append(trainer.cfg.trainer.run_id)
            assert [h["sync/version"] for h in trainer.history] == ([1.0, 2.0, 3.0] if name == "a" else [1.0])
            health = ray.get([a.health.remote() for a in trainer.workers.rollout.actors])
            assert [h["version"] for h in health] == ([3, 3] if name == "a" else [1, 1])
        finally:
            trainer.close()
    assert runs[0] != runs[1]
    assert sorted(p.name for p in (shared / runs[0] / "sync").glob("v*.pt")) == ["v2.pt", "v3.pt"]
    assert sorted(p.name for p in (shared / runs[1] / "sync").glob("v*.pt")) == ["v1.pt"]


def test_dead_rollout_actor_stops_the_run_with_a_clear_error(ray_cluster, pretrained_model_dir, tmp_path):
    import ray

    from grpo_dist.run.run import TrainingError

    trainer = run_trainer(pretrained_model_dir, tmp_path, {"rollout": {"num_workers": 2}, "trainer": {"steps": 1},
                                                           "cluster": {"max_restarts": 0}})
    try:
        ray.kill(trainer.workers.rollout.actors[1], no_restart=True)
        with pytest.raises(TrainingError) as e:
            e2e.more_steps(trainer)
        msg = str(e.value)
        assert msg.startswith("rollout worker 1 died:") and "\n" not in msg
        assert "cluster.max_restarts=0" in msg and "stopped at step 1" in msg and "resume with:" in msg
    finally:
        trainer.close()


@pytest.mark.heavy  # make test-all: dead engines: test_hangs_e2e.py; dead reward actors: test_pipeline_e2e.py, test_stream_e2e.py
def test_dead_actors_are_replaced_and_their_work_reissued(ray_cluster, pretrained_model_dir, tmp_path, caplog):
    """A dead rollout actor and a dead reward actor are replaced at their ranks; the new rollout
    actor serves the learner's current weights; the step completes on fresh completions; the
    budget (cluster.max_restarts) is respected. A learner death is never 'recovered'."""
    import ray

    from grpo_dist.run.run import TrainingError

    rec = e2e.Recorder()
    trainer = run_trainer(pretrained_model_dir, tmp_path, {
        "rollout": {"num_workers": 2}, "trainer": {"steps": 2}, "cluster": {"max_restarts": 3}}, rec)
    try:
        w = trainer.workers
        old = w.rollout.actors[1]
        ray.kill(old, no_restart=True)
        ray.kill(w.reward.actors[0], no_restart=True)
        with caplog.at_level("WARNING", logger="grpo_dist.cluster"):
            m = e2e.more_steps(trainer)
        assert m["cluster/restarts"] == 2 and w.rollout.actors[1] is not old
        assert sum("replacing it" in r.getMessage() for r in caplog.records) == 2
        health = ray.get([a.health.remote() for a in w.rollout.actors])
        assert [h["version"] for h in health] == [3, 3] == [int(m["sync/version"])] * 2
        assert m["rollout/num_completions"] == 16
        # the replacement generated with the weights of version 2 (restored), like its peer
        assert set(rec.last_batch.adapter_versions) == {2}

        ray.kill(w.rollout.actors[1], no_restart=True)  # dies before the weights reach it
        s = trainer.sync.push(3, wait=True)  # the driver's push of version 3 again
        assert trainer.recovery.restarts == 3 and s["sync/version"] == 3
        assert [h["version"] for h in ray.get([a.health.remote() for a in w.rollout.actors])] == [3, 3]

        ray.kill(w.rollout.actors[0], no_restart=True)  # budget used up: a clear stop
        with pytest.raises(TrainingError, match=r"rollout worker 0 died: .*max_restarts=3"):
            e2e.more_steps(trainer)
    finally:
        trainer.close()


def test_hung_rollout_actor_is_killed_and_replaced(ray_cluster, pretrained_model_dir, tmp_path):
    """A rollout actor that stops answering (fault injection: its next generate stalls 600 s) is
    declared hung after rollout.generate_timeout_s, killed, replaced, and the step completes."""
    import time

    import ray
    from ray.exceptions import RayActorError

    trainer = run_trainer(pretrained_model_dir, tmp_path, {
        "rollout": {"num_workers": 2, "generate_timeout_s": 20}, "trainer": {"steps": 1},
        "cluster": {"max_restarts": 1}})
    try:
        w = trainer.workers
        hung = w.rollout.actors[0]
        ray.get(hung.debug_call.remote(hang_next_generate, 600))
        t0 = time.perf_counter()
        m = e2e.more_steps(trainer)
        assert time.perf_counter() - t0 < 300
        assert m["cluster/restarts"] == 1 and w.rollout.actors[0] is not hung
        assert m["rollout/num_completions"] == 16
        with pytest.raises(RayActorError):  # the hung actor was killed, not left running
            ray.get(hung.health.remote(), timeout=60)
    finally:
        trainer.close()


def test_nan_from_the_learner_stops_before_sync(ray_cluster, pretrained_model_dir, tmp_path):
    """Fault injection: an infinite learning rate turns the adapter to inf/NaN in one update; the
    learner's train/param_norm says so and the run stops loudly before that adapter is synced."""
    import ray

    from grpo_dist.run.run import TrainingError

    trainer = run_trainer(pretrained_model_dir, tmp_path, {"trainer": {"steps": 1}})
    try:
        learner = trainer.workers.learner.actors[0]
        ray.get(learner.debug_call.remote(set_lr, float("inf")))
        version = ray.get(trainer.workers.rollout.actors[0].health.remote())["version"]
        with pytest.raises(TrainingError, match="non-finite metrics from the learner") as e:
            e2e.more_steps(trainer)
        assert "train/param_norm" in str(e.value) and "\n" not in str(e.value)
        assert ray.get(trainer.workers.rollout.actors[0].health.remote())["version"] == version
    finally:
        trainer.close()
