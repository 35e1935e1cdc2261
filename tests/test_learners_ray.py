"""Two learner ranks as Ray actors, driven by the driver loop: ZeRO-2 and ZeRO-3 train, checkpoint
(each rank's files shipped to the driver), resume, and end with the adapter that one learner
trained on the same batches has.

The rollouts come from the transformers backend (seconds to start; vLLM is covered elsewhere);
the batches each step trained on are recorded and replayed into a single in-process ZeRO-0
learner with the same optimizer, schedule and clipping.
"""

from __future__ import annotations

from pathlib import Path

import e2e
import pytest
import torch

from grpo_dist.config import load_config

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def local_ray():
    from grpo_dist.cluster.ray_utils import shutdown_ray

    shutdown_ray()
    yield
    shutdown_ray()


def config(model_dir, out, **over):
    base = {
        "output_dir": str(out), "model": {"path": str(model_dir), "make_if_missing": None},
        "rollout": {"backend": "hf", "num_workers": 1, "prompts_per_step": 4, "group_size": 4, "max_tokens": 5},
        # per-rank batch 8 in micro-batches of 4: gradient accumulation inside each rank too
        "learner": {"num_learners": 2, "micro_batch_size": 4, "lr": 5e-3, "warmup_steps": 2},
        "lora": {"dropout": 0.0},
        "trainer": {"steps": 3, "eval_before_after": False},
        "checkpoint": {"every": 2, "keep": 2}, "logging": {"wandb_mode": "disabled", "progress": False},
        # torch_threads auto: 2 CPUs / 2 learner ranks on the node = 1 thread each (checked below)
        "cluster": {"num_cpus": 2, "learner_cpus": 0.5, "rollout_cpus": 0.5, "reward_cpus": 0.25,
                    "torch_threads": "auto"},
    }
    for k, v in over.items():
        base[k] = {**base.get(k, {}), **v}
    return load_config(ROOT / "configs/tiny_cpu.yaml", base)


def run(cfg):
    from grpo_dist.train import train

    rec = e2e.Recorder()
    trainer = e2e.start(cfg, rec)
    try:
        assert [r["torch_threads"] for r in trainer.info["learner"]] == [1] * cfg.learner.num_learners
        start = trainer.step
        train(trainer)
    finally:
        trainer.close()
    return start, [s["batch"] for s in rec.steps], trainer


def adapter_tensors(directory) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(Path(directory) / "adapter_model.safetensors"))


@pytest.mark.timeout(900)
# make test-all: learner ranks as Ray actors rendezvous and train across nodes in make test
# (test_multinode.py, test_netns_job.py); two ranks == one process (test_learner_dist.py)
@pytest.mark.heavy
@pytest.mark.parametrize("zero", [2, 3])
def test_two_ranks_train_save_resume_like_one_learner(zero, local_ray, pretrained_model_dir, tmp_path,
                                                       in_process_learners):
    from grpo_dist.testing.learner import make_learner

    out = tmp_path / "run"
    cfg = config(pretrained_model_dir, out, learner={"zero_stage": zero})
    start1, batches1, t1 = run(cfg)
    assert start1 == 0 and len(batches1) == 3
    assert sorted(p.name for p in (out / "checkpoints").glob("step_*")) == ["step_000002", "step_000003"]
    start2, batches2, t2 = run(cfg.model_copy(update={"trainer": cfg.trainer.model_copy(update={"steps": 5}),
                                                      "checkpoint": cfg.checkpoint.model_copy(update={"resume": "auto"})}))
    assert start2 == 3 and len(batches2) == 2, "resumed from the newest checkpoint (step 3)"
    # the resumed run's records cover the whole run: steps 1-3 from the checkpoint, then 4 and 5
    assert [h["train/version"] for h in t2.history] == [1.0, 2.0, 3.0, 4.0, 5.0]
    assert t2.history[:3] == t1.history
    assert t2.cfg.trainer.run_id == t1.cfg.trainer.run_id

    single = config(pretrained_model_dir, tmp_path / "single",
                    learner={"num_learners": 1, "zero_stage": 0, "micro_batch_size": 16})
    learner, _ = make_learner(single)
    losses = [learner.train_step(b)["train/loss"] for b in batches1 + batches2]
    learner.save_adapter(tmp_path / "single-adapter")
    learner.engine.destroy()
    ours, ref = adapter_tensors(out / "adapter"), adapter_tensors(tmp_path / "single-adapter")
    assert ours.keys() == ref.keys() and len(ref) > 0
    diff = max(float((ours[k] - ref[k]).abs().max()) for k in ref)
    moved = max(float(ref[k].abs().max()) for k in ref if "lora_B" in k)
    print(f"ZeRO-{zero}: 2 ranks vs 1 learner, max |adapter diff| {diff:.2e} (lora_B max {moved:.2e}); "
          f"losses {[round(x, 5) for x in losses]} vs {[round(h['train/loss'], 5) for h in t2.history]}")
    # Adam divides each update by sqrt(v), so rounding differences of the 2-rank reduction (~1e-7
    # relative in the gradient; ZeRO-3 also re-partitions and gathers) reach the weights, most of
    # all at step 1, where every advantage is 0 and the gradient is little more than rounding:
    # measured 3.8e-6 (ZeRO-2) and 1.3e-5 (ZeRO-3) after 5 steps in session 3; 2.3e-5 (ZeRO-2,
    # padded), 7.2e-5 (ZeRO-2) and 8.7e-5 (ZeRO-3) packed (the ranks pack one group per row, the
    # single learner four) in session 5. A lost micro-batch or an optimizer reset on resume moves weights by ~lr = 5e-3.
    assert moved > 1e-3, "training moved the adapter"
    assert diff < 5e-4
    for h, loss in zip(t2.history, losses):
        assert h["train/loss"] == pytest.approx(loss, abs=1e-5)


@pytest.mark.timeout(600)
@pytest.mark.heavy  # make test-all: a hung learner rank stops the run with one line: test_hangs_e2e.py in make test
def test_hung_learner_stops_the_run_naming_checkpoint_and_resume_command(local_ray, pretrained_model_dir, tmp_path):
    """A learner rank silent past cluster.learner_timeout_s on a train step: the run stops with one
    line naming the rank, the last checkpoint and the exact resume command (no endless wait)."""
    import ray

    from grpo_dist.testing.learner import hang_next_train_step
    from grpo_dist.run.run import TrainingError

    out = tmp_path / "run"
    cfg = config(pretrained_model_dir, out, learner={"num_learners": 1, "micro_batch_size": 16},
                 checkpoint={"every": 1}, cluster={"learner_timeout_s": 15})

    def hang(run, step):  # before step 2: the learner's next train step stalls
        if step == 2:
            ray.get(run.workers.learner.actors[0].debug_call.remote(hang_next_train_step, 600))

    with pytest.raises(TrainingError) as e:
        e2e.train_run(cfg, e2e.Recorder(hang))
    msg = str(e.value)
    assert msg.startswith("learner worker 0: no answer within 15 s") and "\n" not in msg
    assert f"the last checkpoint is {out / 'checkpoints' / 'step_000001'} (step 1)" in msg
    assert msg.endswith(f"resume with: grpo-dist train --config {out / 'config.yaml'} --checkpoint.resume auto")


@pytest.mark.timeout(600)
def test_colocated_layout_on_cpu_trains_in_shared_bundles(local_ray, pretrained_model_dir, tmp_path):
    """cluster.layout colocated on CPU: learner rank i and engine i share bundle i of one group
    (placement only: no sleep mode without a GPU); the run trains and syncs as usual."""
    import ray

    from grpo_dist.train import train

    cfg = config(pretrained_model_dir, tmp_path / "run", learner={"num_learners": 2}, rollout={"num_workers": 2},
                 cluster={"layout": "colocated", "learner_cpus": 0.25, "rollout_cpus": 0.25}, trainer={"steps": 2},
                 checkpoint={"every": 0})
    trainer = e2e.start(cfg)
    try:
        plans = trainer.workers.placement.plans
        assert set(plans) == {"learner+rollout", "reward"}
        assert plans["learner+rollout"].bundles == [{"CPU": 0.5}, {"CPU": 0.5}]
        table = ray.util.placement_group_table(trainer.workers.placement.groups["learner+rollout"])
        assert table["state"] == "CREATED" and table["strategy"] == "PACK"
        summary = train(trainer)
        assert summary["steps"] == 2 and not trainer.sleeps
        assert [h["version"] for h in ray.get([a.health.remote() for a in trainer.workers.rollout.actors])] == [2, 2]
    finally:
        trainer.close()
