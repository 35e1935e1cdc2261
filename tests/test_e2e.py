"""End to end on the real stack: a local Ray cluster, 2 vLLM (CPU build) rollout actors, a reward
actor, a DeepSpeed learner over base + PEFT LoRA, adapter sync through the object store, W&B
offline. One run is shared by every test here (engines take ~40 s to start).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import e2e
import pytest

from grpo_dist.config import load_config
from grpo_dist.types import TrainBatch

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
STEPS = 12

REQUIRED_METRICS = [
    "rollout/reward_mean", "rollout/reward_std", "rollout/frac_reward_zero_std", "reward/correctness",
    "rollout/completion_length_mean", "rollout/completion_length_max", "rollout/truncated_frac",
    "train/loss", "train/kl", "train/clip_frac_low", "train/clip_frac_high", "train/ratio_mean",
    "train/entropy", "train/grad_norm", "train/lr", "sync/bytes", "sync/seconds",
    "timing/generate", "timing/score", "timing/learn", "timing/sync", "timing/sync_publish", "timing/sync_transfer",
    "timing/step", "timing/other", "perf/tokens_per_s",
]


SOCKETS: dict = {}  # every listening socket of the run's processes, mid-run (step 3)


def _sockets() -> dict:
    import os

    from cluster_scripts import descendants, listening, listening_unix

    pids = descendants(os.getpid())  # the driver (this process) and what it started: Ray, actors, W&B
    return {"tcp": listening(pids), "unix": listening_unix(pids)}


@pytest.fixture(scope="module")
def run(pretrained_model_dir, tmp_path_factory):
    from grpo_dist.cluster.ray_utils import shutdown_ray

    out = tmp_path_factory.mktemp("e2e")
    mp = pytest.MonkeyPatch()  # the base model's evaluation recorded here (run/eval_cache.py): eval --adapter reuses it
    mp.setenv("GRPO_DIST_EVAL_CACHE", str(tmp_path_factory.mktemp("evals")))
    cfg = load_config(ROOT / "configs" / "tiny_cpu.yaml", {
        "output_dir": str(out),
        "model": {"path": str(pretrained_model_dir), "make_if_missing": None},
        "trainer": {"steps": STEPS, "eval_every": 6},
        "checkpoint": {"every": 5, "keep": 2},
        "data": {"eval_size": 64},
        "logging": {"sample_table_every": 5},
    })
    rec = e2e.Recorder(before_step=lambda run, step: SOCKETS.update(_sockets()) if step == 3 else None)
    trainer, summary = e2e.train_run(cfg, rec, keep=True)  # the run the CLI makes: grpo_dist.train.train
    yield trainer, summary
    trainer.close()
    shutdown_ray()
    mp.undo()


def test_workers_are_live_ray_actors(run):
    import ray

    trainer, _ = run
    w = trainer.workers
    assert len(w.rollout) == 2 and len(w.reward) == 1 and len(w.learner) == 1
    infos = ray.get([a.node_info.remote() for g in w.all_groups() for a in g.actors])
    pids = {i["pid"] for i in infos}
    assert len(pids) == 4, "every worker is its own process"
    assert all(ray.get([a.health.remote() for a in w.rollout.actors])[i]["ready"] for i in range(2))
    # a reward actor's process imports the reward worker, not the learner's and engines' stack (run/reward_actor.py)
    from grpo_dist.testing import imported

    heavy = ("torch", "vllm", "deepspeed", "peft")
    assert ray.get(w.reward.actors[0].debug_call.remote(imported, heavy)) == []
    assert ray.get(w.learner.actors[0].debug_call.remote(imported, heavy))[:1] == ["torch"]  # the check sees imports


def test_adapter_version_advances_every_step(run):
    import ray

    trainer, _ = run
    assert [int(h["sync/version"]) for h in trainer.history] == list(range(1, STEPS + 1))
    versions = [h["version"] for h in ray.get([a.health.remote() for a in trainer.workers.rollout.actors])]
    assert versions == [STEPS, STEPS]
    assert all(h["sync/bytes"] > 0 for h in trainer.history)


def test_metrics_present_and_finite(run):
    trainer, _ = run
    for h in trainer.history:
        missing = [k for k in REQUIRED_METRICS if k not in h]
        assert not missing, missing
        bad = {k: v for k, v in h.items() if isinstance(v, float) and not math.isfinite(v)}
        assert not bad, bad


def test_periodic_eval_metrics(run):
    trainer, _ = run
    with_eval = [int(h["step"]) for h in trainer.history if "eval/sampled_accuracy" in h]
    assert with_eval == [6, 12]
    h = trainer.history[-1]
    for k in ("eval/sampled_accuracy", "eval/greedy_accuracy", "eval/pass@1", "eval/pass@4", "eval/mean_reward"):
        assert 0.0 <= h[k] <= 1.0, k
    assert h["eval/pass@4"] >= h["eval/pass@1"]


def test_summary_json_and_wandb_offline_run(run):
    trainer, summary = run
    s = json.loads((Path(trainer.cfg.output_dir) / "summary.json").read_text())
    for key in ("sampled_accuracy_before", "sampled_accuracy_after", "greedy_accuracy_before",
                "greedy_accuracy_after", "steps", "wall_seconds", "adapter_dir", "wandb_dir", "final_metrics"):
        assert key in s, key
    assert s["steps"] == STEPS
    wandb_files = list(Path(s["wandb_dir"]).glob("*.wandb"))
    assert wandb_files and wandb_files[0].stat().st_size > 0


def test_checkpoints_exist_and_load(run):
    import ray
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from grpo_dist.run.checkpoint import STATE_FILE, list_checkpoints

    trainer, _ = run
    ckpts = list_checkpoints(trainer.cfg.checkpoint_dir)
    assert [p.name for p in ckpts] == ["step_000010", f"step_{STEPS:06d}"]  # every 5, keep 2, + final
    last = ckpts[-1]
    state = json.loads((last / STATE_FILE).read_text())
    assert state["step"] == STEPS and state["data"] == trainer.rollouts.stream.state_dict()  # the final position
    data = state["data"]
    assert data["epoch"] * data["num_records"] + data["index"] == STEPS * trainer.cfg.rollout.prompts_per_step
    base = AutoModelForCausalLM.from_pretrained(trainer.cfg.model.path)
    model = PeftModel.from_pretrained(base, str(last / "adapter"))
    assert any("lora_B" in n and p.abs().sum() > 0 for n, p in model.named_parameters())
    # the live learner reloads the older checkpoint: its version goes back to that step
    lg = trainer.workers.learner
    ray.get(lg.actors[0].load_checkpoint.remote(str(ckpts[0])))
    assert ray.get(lg.actors[0].export_update.remote()).version == 10
    ray.get(lg.actors[0].load_checkpoint.remote(str(last)))
    assert ray.get(lg.actors[0].export_update.remote()).version == STEPS


def test_vllm_and_learner_logprobs_agree(run):
    """Same completion, same adapter version: vLLM's behaviour log-probs vs the learner's.

    Both run the same fp32 weights (base + LoRA v=STEPS) and the same temperature-scaled
    log-softmax; only kernels and accumulation order differ (vLLM's CPU attention and its
    LoRA punica ops vs eager PyTorch). Seen: ~1e-6. Tolerance 1e-3 is far below any learning
    signal (a ratio error of 0.1%) and far above fp32 round-off, so a real mismatch (wrong
    temperature, wrong adapter version, an off-by-one token alignment: errors of 0.1-5 nats)
    fails it.
    """
    import ray

    from grpo_dist.data import make_task

    trainer, _ = run
    recs = make_task("add", 4, seed=7, split="eval")
    groups = ray.get(trainer.workers.rollout.actors[0].generate.remote(recs, n=4))
    rollouts = [r for g in groups for r in g.rollouts]
    assert all(r.adapter_version == STEPS for r in rollouts)
    batch = TrainBatch(prompt_ids=[r.prompt_ids for r in rollouts], completion_ids=[r.completion_ids for r in rollouts],
                       behaviour_logprobs=[r.logprobs for r in rollouts], advantages=[0.0] * len(rollouts))
    learner_lp = ray.get(trainer.workers.learner.actors[0].compute_logprobs.remote(batch))
    diffs = [abs(a - b) for r, lp in zip(rollouts, learner_lp) for a, b in zip(r.logprobs, lp)]
    assert len(diffs) == sum(len(r.completion_ids) for r in rollouts) > 0
    print(f"max |logp_vllm - logp_learner| = {max(diffs):.2e} over {len(diffs)} tokens")
    assert max(diffs) < 1e-3
    # and the per-step metric the trainer logs says the same during training
    assert max(h["train/logprob_diff_behaviour_max"] for h in trainer.history) < 1e-3


def test_final_adapter_is_servable_by_vllm(run):
    import ray

    from grpo_dist.data import make_task

    trainer, summary = run
    w0 = trainer.workers.rollout.actors[0]
    recs = make_task("add", 8, seed=3, split="eval")
    live = ray.get(w0.generate.remote(recs, temperature=0.0))
    ray.get(w0.load_adapter_dir.remote(summary["adapter_dir"], 10_000))
    from_disk = ray.get(w0.generate.remote(recs, temperature=0.0))
    assert [g.rollouts[0].completion_ids for g in live] == [g.rollouts[0].completion_ids for g in from_disk]


def test_training_raises_reward(run):
    trainer, summary = run
    curve = [h["rollout/reward_mean"] for h in trainer.history]
    first, last = sum(curve[:4]) / 4, sum(curve[-4:]) / 4
    print(f"reward curve {[round(c, 3) for c in curve]}; accuracy {summary['sampled_accuracy_before']:.3f} -> "
          f"{summary['sampled_accuracy_after']:.3f}")
    assert last - first >= 0.1
    assert summary["sampled_accuracy_after"] - summary["sampled_accuracy_before"] >= 0.1


def test_eval_cli_reports_base_and_adapter(run, tmp_path):
    """`grpo-dist eval --adapter` in its own process: its own local Ray cluster and vLLM workers. The
    base model's evaluation is the training's (recorded before it trained, reused: the same model,
    sets, seed and sampling; one engine here, two there); only the adapter is evaluated."""
    import subprocess
    import sys

    trainer, summary = run
    report_path = tmp_path / "report.json"
    r = subprocess.run(
        [sys.executable, "-m", "grpo_dist.cli", "eval", "--config", str(ROOT / "configs/tiny_cpu.yaml"),
         "--adapter", summary["adapter_dir"], "--out", str(report_path), "--model.path", trainer.cfg.model.path,
         "--model.make_if_missing", "null", "--rollout.num_workers", "1", "--data.eval_size", "64",
         "--output_dir", str(tmp_path), "--logging.wandb_mode", "offline"],
        cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    report = json.loads(report_path.read_text())
    assert "base-model evaluation reused from " in r.stdout and "evaluating the base model" not in r.stdout
    assert report["base"]["reused_from"] in r.stdout
    assert {k: v for k, v in report["base"].items() if k not in ("samples", "reused_from")} == summary["eval_before"]
    for which in ("base", "adapter_eval"):
        assert {"sampled_accuracy", "greedy_accuracy", "pass@1", "pass@4", "mean_reward"} <= set(report[which])
        assert report[which]["num_prompts"] == 64 and report[which]["samples"]
    assert report["delta"]["sampled_accuracy"] == pytest.approx(
        report["adapter_eval"]["sampled_accuracy"] - report["base"]["sampled_accuracy"])
    assert report["delta"]["sampled_accuracy"] >= 0.1  # the trained adapter is better than the base
    # the same numbers the trainer measured at the end of training (same prompts, same eval seed)
    assert report["adapter_eval"]["greedy_accuracy"] == pytest.approx(
        summary["eval_after"]["greedy_accuracy"], abs=0.1)


def test_full_weight_sync_through_vllm_reload(run):
    """lora.enabled: false path: all weights travel and vLLM reloads them (reload_weights).

    Runs last: it replaces the live engine's base weights.
    """
    import ray
    import torch
    from transformers import AutoModelForCausalLM

    from grpo_dist.data import make_task
    from grpo_dist.types import AdapterUpdate

    trainer, _ = run
    w0 = trainer.workers.rollout.actors[0]
    ray.get(w0.load_adapter_dir.remote(None, 20_000))  # serve the base model, no LoRA
    model = AutoModelForCausalLM.from_pretrained(trainer.cfg.model.path)
    torch.manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.02 * torch.randn_like(p))
    update = AdapterUpdate(20_001, {k: v.detach().clone() for k, v in model.state_dict().items()}, None)
    info = ray.get(w0.load_update.remote(update))
    assert info["version"] == 20_001 and info["bytes"] > 1_000_000
    r = ray.get(w0.generate.remote(make_task("add", 1, seed=5, split="eval"), n=1))[0].rollouts[0]
    ids = torch.tensor([r.prompt_ids + r.completion_ids])
    with torch.no_grad():
        lp = torch.log_softmax(model(ids).logits[0] / trainer.cfg.rollout.temperature, -1)
    p = len(r.prompt_ids)
    assert max(abs(lp[p + j - 1, t].item() - r.logprobs[j]) for j, t in enumerate(r.completion_ids)) < 1e-3


def test_summary_reports_peak_memory_per_role_and_metrics_per_step(run):
    """summary.json's ``peak_rss_gib``: each role's largest actor with its child processes (the
    vLLM engine's core process holds the model: the rollout role is not just its actor); and
    metrics.jsonl holds each step's metrics, as logged."""
    import ray

    from grpo_dist.run.outputs import read_metrics

    trainer, summary = run
    assert read_metrics(trainer.cfg.output_dir) == trainer.history
    peak = summary["peak_rss_gib"]
    assert set(peak) == {"learner", "rollout", "reward", "driver"}
    assert all(0.05 < v < 16 for v in peak.values()), peak
    start = summary["startup"]  # where the actors' start-up went: the set-ups overlap inside the total
    assert 0 < start["startup/engine_s"] <= start["startup/actors_s"], start
    assert 0 < start["startup/learner_s"] <= start["startup/actors_s"], start
    hosts = summary["hosts"]  # one machine: every role on the driver's node, one address per actor
    assert {r: len(ips) for r, ips in hosts.items()} == {"driver": 1, "learner": trainer.cfg.learner.num_learners,
                                                         "rollout": trainer.cfg.rollout.num_workers,
                                                         "reward": trainer.cfg.reward.num_workers}, hosts
    assert {ip for ips in hosts.values() for ip in ips} == set(hosts["driver"]), hosts
    engine = ray.get(trainer.workers.rollout.actors[0].peak_rss.remote())
    if trainer.cfg.rollout.engine_in_process:  # the CPU default: vLLM's engine core in the actor
        assert engine["children"] == 0 and engine["self"] > 2**28, engine  # no engine process; vLLM's memory is the actor's
    else:
        assert engine["children"] > 0  # vLLM's engine process(es), counted
    # the summary counted the engine's memory (most of the role's); the tests before this one used
    # the engines further, so today's peaks may be a little higher than the summary's
    assert peak["rollout"] * 2**30 >= 0.8 * (engine["self"] + engine["children"])


def test_every_socket_the_run_listens_on_is_private(run):
    """Issue 41: a default run opens no door to other users or hosts. TCP: loopback only (Ray's ports
    need the cluster token; Ray's two Prometheus exporters are read-only); Unix: none abstract (any
    process of the network namespace reaches those), each path connectable by this user only
    (the Ray session's directory is private, W&B's socket is not writable by others)."""
    from cluster_scripts import only_owner_connects

    tcp, unix = SOCKETS["tcp"], SOCKETS["unix"]
    names = {n for _, _, n in tcp} | {n for _, n in unix}
    assert {"gcs_server", "raylet", "wandb-core"} <= names, (tcp, unix)  # the snapshot saw the live run
    assert [t for t in tcp if t[0] not in ("127.0.0.1", "::ffff:127.0.0.1", "::1")] == [], tcp
    assert [u for u in unix if u[0].startswith("@")] == [], unix
    opened = [u for u in unix if not only_owner_connects(u[0])]
    assert opened == [], opened
