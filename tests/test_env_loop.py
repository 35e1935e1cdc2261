"""The whole multi-turn loop, fast (CI): the demo's tiny model in an in-process rollout worker
(transformers backend) talks to a scripted tool environment; the trajectories' environment tokens
have loss mask 0 at their positions, the limits end trajectories with their stop reasons, the
counters reach the reward columns and the metrics, and an in-process learner takes a step on the
batch using the mask (token count, importance weights). One check of the learner's diagnostics
ignored the mask (environment tokens counted as engine/learner mismatch): fixed, tested."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from grpo_dist.batch import build_batch
from grpo_dist.config import load_config
from grpo_dist.data import make_task
from grpo_dist.envs.rewards import env_reward
from grpo_dist.testing.learner import make_learner, small_config
from grpo_dist.rollout.worker import RolloutWorker
from grpo_dist.types import RewardResult

pytestmark = pytest.mark.usefixtures("in_process_learners")
SCRIPT = f"{Path(__file__).parent / 'env_helpers.py'}:ToolScript"


def _worker(model_dir, **rollout):
    cfg = load_config(None, {"model": {"path": str(model_dir), "dtype": "float32"}, "lora": {"enabled": False},
                             "rollout": {"backend": "hf", "group_size": 4, "max_tokens": 6, "env": SCRIPT, **rollout}})
    w = RolloutWorker(cfg)
    w.setup()
    return w


@pytest.fixture(scope="module")
def loop(pretrained_model_dir):
    """Trajectories of two prompts x 4, their batch and metrics, and a learner that trained on them."""
    w = _worker(pretrained_model_dir)
    groups = w.generate(make_task("add", 2, seed=7, split="eval"), keys=[(0, 1, i) for i in range(2)])
    tok = w.engine.tokenizer
    w.close()
    flat = [r for g in groups for r in g.rollouts]
    sampled = env_reward([r.prompt for r in flat], [r.completion for r in flat],
                         env_reward=[r.columns["env_reward"] for r in flat])
    assert sampled == [r.columns["env_reward"] or 0.0 for r in flat]
    # the learner's step needs rewards that differ within a group: what the trajectories sampled may
    # all agree (machine-dependent sampling; zero advantages, no gradient), so 0 / 1 alternate
    scores = RewardResult(total=[float(i % 2) for i in range(len(flat))], per_function={})
    cfg = small_config(pretrained_model_dir, algo={"rollout_is": "truncate", "beta": 0.0})
    batch, metrics = build_batch(groups, scores, 4, cfg.algo, cfg.rollout.max_tokens)
    learner, _ = make_learner(cfg)
    yield tok, flat, batch, metrics, learner
    learner.shutdown()


def test_masks_columns_and_metrics_of_the_scripted_tool_loop(loop):
    tok, flat, batch, m, _ = loop
    tool_glue = [tok("\ntool: 4\nassistant: ", add_special_tokens=False)["input_ids"],
                 tok("\ntool: Error: bad\nassistant: ", add_special_tokens=False)["input_ids"]]
    for r in flat:
        assert r.stop_reason in ("done", "length") and r.columns["stop_reason"] == r.stop_reason
        runs = _runs(r.loss_mask)  # (value, start, length)
        assert [v for v, _, _ in runs][:3] == [1, 0, 1][:len(runs)]
        zeros = [(s, n) for v, s, n in runs if v == 0]
        for k, (s, n) in enumerate(zeros):  # each environment answer: exactly the template's tokens
            assert r.completion_ids[s:s + n] == tool_glue[k] and all(lp == 0.0 for lp in r.logprobs[s:s + n])
            assert r.completion_ids[s - 1] == tok.eos_token_id and r.loss_mask[s - 1] == 1  # the EOS it sampled
        if r.stop_reason == "done":
            assert r.turns == 3 and len(zeros) == 2 and r.columns["tool_calls"] == 2 and r.columns["tool_errors"] == 1
            assert r.columns["env_reward"] in (0.0, 1.0) and not r.columns["truncated"]
        else:  # a turn that used all of max_tokens ends the trajectory
            assert r.columns["truncated"] and r.finish_reason == "length" and r.columns["env_reward"] is None
    assert batch.loss_mask == [[float(x) for x in r.loss_mask] for r in flat]
    n = len(flat)
    assert m["rollout/tool_calls"] == sum(r.columns["tool_calls"] for r in flat)
    assert m["rollout/tool_errors_mean"] == pytest.approx(sum(r.columns["tool_errors"] for r in flat) / n)
    assert sum(v for k, v in m.items() if k.startswith("rollout/stop_reason/")) == n
    assert m["rollout/turns_mean"] == pytest.approx(sum(r.turns for r in flat) / n)
    masked = sum(len(r.loss_mask) - sum(r.loss_mask) for r in flat)
    assert m["rollout/env_token_frac"] == pytest.approx(masked / sum(len(r.completion_ids) for r in flat))


def _runs(mask):
    out, start = [], 0
    for i in range(1, len(mask) + 1):
        if i == len(mask) or mask[i] != mask[start]:
            out.append((mask[start], start, i - start))
            start = i
    return out


def test_the_learner_steps_on_the_masked_batch(loop):
    _, flat, batch, _, learner = loop
    assert any(0.0 in row for row in batch.loss_mask)
    out = learner.train_step(batch)
    assert out["train/tokens"] == sum(sum(r.loss_mask) for r in flat)  # the loss counts sampled tokens only
    assert out["train/version"] == 1.0 and out["train/grad_norm"] > 0
    assert out["train/is_ratio_max"] < 1.05  # engine vs learner on sampled tokens only (see below)


def _with_bad_behaviour_on_environment_tokens(batch):
    """The batch with the behaviour log-prob of every loss-mask-0 token set to -30 (no engine sampled
    them: the value must not matter)."""
    import copy

    b = copy.deepcopy(batch)
    b.behaviour_logprobs = [[lp if m else -30.0 for lp, m in zip(lps, mask)]
                            for lps, mask in zip(b.behaviour_logprobs, b.loss_mask)]
    return b


def test_importance_weights_ignore_environment_tokens(loop):
    _, _, batch, _, learner = loop
    out = learner.train_step(_with_bad_behaviour_on_environment_tokens(batch))
    # the policy moved one step since sampling (ratios of a few); counted, the -30s would give ~e^25
    assert out["train/is_ratio_max"] < 20


def test_behaviour_logprob_diagnostics_ignore_environment_tokens(loop):
    """With the weights held still (learning rate 0), the engine-vs-learner gap is the same whatever
    the environment tokens' behaviour values are: only sampled tokens count (before the fix, the
    -30s made the max ~25)."""
    from grpo_dist.testing.learner import set_lr

    _, _, batch, _, learner = loop
    set_lr(learner, 0.0)
    a = learner.train_step(batch)
    b = learner.train_step(_with_bad_behaviour_on_environment_tokens(batch))
    for k in ("train/logprob_diff_behaviour_max", "train/logprob_diff_behaviour_mean"):
        assert b[k] == pytest.approx(a[k], rel=1e-6, abs=1e-7), k
    assert b["train/logprob_diff_behaviour_max"] < 20


def test_limits_end_trajectories_with_their_stop_reason(pretrained_model_dir):
    recs = make_task("add", 2, seed=7, split="eval")
    keys = [(0, 1, i) for i in range(2)]
    w = _worker(pretrained_model_dir, max_turns=2)
    rs = [r for g in w.generate(recs, keys=keys) for r in g.rollouts]
    w.close()
    assert {r.stop_reason for r in rs} <= {"max_turns", "length"} and any(r.stop_reason == "max_turns" for r in rs)
    assert all(r.turns <= 2 and r.columns["truncated"] for r in rs)

    w = _worker(pretrained_model_dir, max_total_tokens=9)
    rs = [r for g in w.generate(recs, keys=keys) for r in g.rollouts]
    w.close()
    assert all(len(r.completion_ids) <= 9 for r in rs) and any(r.stop_reason == "budget" for r in rs)

    w = _worker(pretrained_model_dir, env_kwargs={"sleep_s": 30.0}, trajectory_timeout_s=2.0)
    t0 = time.monotonic()
    rs = [r for g in w.generate(recs, keys=keys) for r in g.rollouts]
    took = time.monotonic() - t0
    w.close()
    assert took < 25 and all(r.stop_reason in ("timeout", "length") for r in rs)
    assert any(r.stop_reason == "timeout" for r in rs)
