"""Same seed, same run: whole runs on the real stack (local Ray, DeepSpeed learner, W&B off).

Each completion's sampling seed is derived from (trainer seed, step, prompt index, sample
index), so runs with one or two vLLM rollout workers sample the same tokens, two runs with the
same seed give the same metrics, and so does a run whose rollout worker is killed and replaced. What is left: vLLM (and
the batched transformers backend) computes a prompt's logits in a batch whose composition
depends on the sharding, so its behaviour log-probs may differ in the last float bits between
the two layouts, and with them the learner's ``logprob_diff_behaviour`` diagnostics; the test
bounds that difference (it never changes a token here, and in sync mode the loss does not use them).
"""

from __future__ import annotations

import e2e
import pytest

pytestmark = pytest.mark.slow
STEPS = 3
VARIES = ("timing/", "perf/", "sync/seconds", "train/logprob_diff_behaviour_")  # clocks, and see above


def run(model_dir, out, backend: str, workers: int, seed: int = 0, steps: int = STEPS, kill_before: int = 0,
        evaluate: bool = False):
    """A short run; returns (per-step metrics, per-step completion ids, per-step behaviour log-probs,
    the evaluation before training). ``kill_before=k``: rollout worker ``workers - 1`` is killed just
    before step k (and replaced). ``evaluate``: 8 held-out prompts before and after training."""
    import ray

    def kill(run, step):
        if step == kill_before:
            ray.kill(run.workers.rollout.actors[-1], no_restart=True)

    rec = e2e.Recorder(kill)
    cfg = e2e.config(model_dir, out, workers=workers, steps=steps, rollout={"backend": backend, "max_tokens": 6},
                     learner={"micro_batch_size": 16}, trainer={"steps": steps, "seed": seed, "eval_before_after": evaluate},
                     data={"eval_size": 8}, eval={"samples_per_prompt": 2, "pass_k": [1, 2]})
    t, _ = e2e.train_run(cfg, rec)
    steady = [{k: v for k, v in h.items() if not k.startswith(VARIES)} for h in t.history]
    return steady, [s["completion_ids"] for s in rec.steps], [s["logprobs"] for s in rec.steps], t.before


def test_same_seed_twice_gives_identical_metrics(ray_cluster, pretrained_model_dir, tmp_path, monkeypatch, capsys):
    # the base model evaluated once (run/eval_cache.py): run a records its evaluation, b and d reuse it (d: another
    # training seed); whether a run evaluated before training or reused, its training is the same
    monkeypatch.setenv("GRPO_DIST_EVAL_CACHE", str(tmp_path / "evals"))
    a, ca, la, before = run(pretrained_model_dir, tmp_path / "a", "hf", 1, evaluate=True)
    assert "evaluating 8 held-out prompts before training" in capsys.readouterr().out
    b, cb, _, reused = run(pretrained_model_dir, tmp_path / "b", "hf", 1, evaluate=True)
    out = capsys.readouterr().out
    assert "base-model evaluation reused from " in out and "before training ..." not in out
    assert before["num_prompts"] == 8 and reused == {**before, "reused_from": str(next((tmp_path / "evals").iterdir()))}
    assert len(a) == STEPS and a == b and ca == cb
    # two workers, the second one killed before step 2 and replaced: still the same run
    c, cc, lc, _ = run(pretrained_model_dir, tmp_path / "c", "hf", 2, kill_before=2)
    assert [h.pop("cluster/restarts") for h in c] == [0.0, 1.0, 1.0]
    assert cc == ca and c == [{k: v for k, v in h.items() if k != "cluster/restarts"} for h in a]
    assert max(abs(x - y) for s1, s2 in zip(la, lc) for r1, r2 in zip(s1, s2) for x, y in zip(r1, r2)) < 1e-4
    d, cd, _, reused = run(pretrained_model_dir, tmp_path / "d", "hf", 1, seed=1, steps=1, evaluate=True)
    assert cd[0] != ca[0]  # the seed matters (to training, not to the evaluation of the base model)
    assert reused == {**before, "reused_from": reused["reused_from"]} and "reused from" in capsys.readouterr().out


@pytest.mark.heavy  # make test-all: per-sample seeds (same seed, same run: the test above) are in make test
def test_one_and_two_vllm_workers_sample_the_same_completions(ray_cluster, pretrained_model_dir, tmp_path):
    one, c1, lp1, _ = run(pretrained_model_dir, tmp_path / "one", "vllm", 1)
    two, c2, lp2, _ = run(pretrained_model_dir, tmp_path / "two", "vllm", 2)
    assert c1 == c2  # every step: the same tokens from one worker or two
    assert one == two  # hence the same rewards, advantages, losses and updates
    diff = max(abs(x - y) for s1, s2 in zip(lp1, lp2) for r1, r2 in zip(s1, s2) for x, y in zip(r1, r2))
    print(f"max |behaviour log-prob difference| one vs two vLLM workers: {diff:.2e}")
    assert diff < 1e-4
