"""The user rollout function (``rollout.rollout_fn``, grpo_dist/rollout/user_fn.py): what it
returns is checked with errors naming it; in a rollout worker (the demo's tiny model, transformers
backend) its ids, masks and log-probs are the Rollouts', plain or async, with the seeds of today's
completions; through a real run (Ray, the driver, the learner) the trained batch holds exactly
what it returned, and the W&B conversation table shows its turns."""

from __future__ import annotations

import json
from pathlib import Path

import e2e
import pytest

from grpo_dist.config import ConfigError, load_config
from grpo_dist.data import make_task
from grpo_dist.rollout.user_fn import RolloutFnError, check_result
from grpo_dist.testing.rollout import hf_worker

HELPERS = Path(__file__).parent / "env_helpers.py"


def _check(out, name="f.py:fn", max_model_len=64):
    return check_result(name, 7, out, [1, 2, 3], max_model_len, 100)


@pytest.mark.parametrize("out, msg", [
    ({"completion_ids": [4, 5], "loss_mask": [1], "logprobs": [-1.0, -1.0]},
     "lists of different lengths: completion_ids 2, loss_mask 1, logprobs 2"),
    ({"completion_ids": [4, 5], "loss_mask": [1, 2], "logprobs": [-1.0, -1.0]},
     r"loss_mask values other than 0 and 1 \(first: 2\)"),
    ({"completion_ids": [4, 5], "loss_mask": [1, 1], "logprobs": [-1.0, None]},
     r"no behaviour log-prob for token 1 \(loss mask 1\): None"),
    ({"completion_ids": [4, 5], "loss_mask": [1, 1], "logprobs": [-1.0, float("nan")]}, "token 1"),
    ({"completion_ids": [4, 500], "loss_mask": [1, 1], "logprobs": [-1.0, -1.0]},
     r"completion_ids with 1 values that are not token ids \(first: 500, vocabulary size 100\)"),
    ({"completion_ids": [4], "mask": [1], "logprobs": [-1.0]}, "without loss_mask; with unknown keys mask"),
    ((1, 2), "a tuple, not a dict"),
    ({"completion_ids": [4], "loss_mask": [1], "logprobs": [-1.0], "stop_reason": "stop"},
     "stop_reason 'stop', not one of done, length, budget, context, max_turns, timeout, env_error, abort"),
    ({"completion_ids": list(range(70)), "loss_mask": [0] * 70, "logprobs": [0.0] * 70},
     "73 tokens .* more than model.max_model_len 64"),
])
def test_a_broken_result_is_refused_naming_the_function(out, msg):
    with pytest.raises(RolloutFnError, match=r"rollout.rollout_fn 'f.py:fn' returned .*" + msg):
        _check(out)


def test_a_valid_result_keeps_masked_log_probs_free():
    out = _check({"completion_ids": [4, 5, 6], "loss_mask": [1, 0, 1], "logprobs": [-0.5, None, -0.25],
                  "reward": 1})
    assert out["prompt_ids"] == [1, 2, 3] and out["loss_mask"] == [1, 0, 1]


def test_config_refuses_it_with_an_environment_or_a_missing_function(tiny_model_dir):
    from grpo_dist.run import preflight

    with pytest.raises(ConfigError, match="rollout.rollout_fn replaces the environment"):
        load_config(None, {"rollout": {"rollout_fn": f"{HELPERS}:two_calls", "env": "calculator"}})
    with pytest.raises(ConfigError, match=r"rollout.rollout_fn: rollout function .*has no attribute 'nope'"):
        preflight.check(load_config(None, {"model": {"path": str(tiny_model_dir)}, "data": {"eval_path": None},
                                           "rollout": {"rollout_fn": f"{HELPERS}:nope"}}))


def _worker(model_dir, **rollout):
    return hf_worker(model_dir, **rollout)


def test_in_a_worker_the_rollouts_are_what_it_returned(pretrained_model_dir):
    single = _worker(pretrained_model_dir)
    plain = _worker(pretrained_model_dir, rollout_fn=f"{HELPERS}:two_calls")
    recs = make_task("add", 3, seed=5, split="eval")
    keys = [(0, 1, i) for i in range(3)]
    try:
        one, groups = single.generate(recs, keys=keys), plain.generate(recs, keys=keys)
        plain.cfg.rollout.rollout_fn = f"{HELPERS}:two_calls_async"
        from grpo_dist.rollout.user_fn import UserRollouts

        plain.user_fn = UserRollouts.from_config(plain.cfg.rollout)
        agroups = plain.generate(recs, keys=keys)
        tok = plain.engine.tokenizer
        reply = tok(" 2+2=", add_special_tokens=False)["input_ids"]
        for g1, g2, g3 in zip(one, groups, agroups):
            for r1, r2, r3 in zip(g1.rollouts, g2.rollouts, g3.rollouts):
                n1 = len(r1.completion_ids)  # call 1 samples with the trajectory's seed: today's completion
                assert r2.completion_ids[:n1] == r1.completion_ids  # log-probs to rounding (batch shapes)
                assert r2.logprobs[:n1] == pytest.approx(r1.logprobs, abs=1e-5)
                assert r2.completion_ids[n1:n1 + len(reply)] == reply
                n2 = len(r2.completion_ids) - n1 - len(reply)
                assert 1 <= n2 <= 3 and r2.loss_mask == [1] * n1 + [0] * len(reply) + [1] * n2
                assert r2.turns == 2 and r2.stop_reason == "done" and r2.columns["turns"] == 2
                assert r2.columns["tool_calls"] == 1 and r2.columns["env_reward"] in (0.0, 1.0, 2.0)
                assert [m["role"] for m in r2.messages] == ["assistant", "user", "assistant"]
                # the async function, awaiting agenerate: the same tokens
                assert (r3.completion_ids, r3.loss_mask, r3.logprobs) == (r2.completion_ids, r2.loss_mask, r2.logprobs)
        plain.cfg.rollout.rollout_fn = f"{HELPERS}:mask_too_short"
        plain.user_fn = UserRollouts.from_config(plain.cfg.rollout)
        with pytest.raises(RolloutFnError, match=r"rollout.rollout_fn '.*env_helpers.py:mask_too_short' returned "
                                                 r"lists of different lengths"):
            plain.generate(recs[:1], keys=keys[:1])
    finally:
        single.close()
        plain.close()


@pytest.mark.slow
def test_a_real_run_trains_on_what_it_returned(pretrained_model_dir, tmp_path, ray_cluster):
    log = tmp_path / "returned.jsonl"
    cfg = e2e.config(pretrained_model_dir, tmp_path / "run", steps=1,
                     rollout={"rollout_fn": f"{HELPERS}:two_calls", "rollout_fn_kwargs": {"log": str(log)}},
                     reward={"functions": [{"fn": "grpo_dist.envs.rewards:env_reward"}]},
                     logging={"wandb_mode": "offline", "progress": False, "sample_table_every": 1})
    rec = e2e.Recorder()
    run, summary = e2e.train_run(cfg, rec)
    returned = [json.loads(line) for line in log.read_text().splitlines()]
    batch = rec.last_batch
    assert len(returned) == len(batch.completion_ids) == 16
    by_ids = {(tuple(r["prompt_ids"]), tuple(r["completion_ids"])): r for r in returned}
    for p, c, m, lp in zip(batch.prompt_ids, batch.completion_ids, batch.loss_mask, batch.behaviour_logprobs):
        r = by_ids[(tuple(p), tuple(c))]  # the trained tokens: exactly a returned trajectory
        assert m == [float(x) for x in r["loss_mask"]] and 0.0 in m
        assert lp == [x if k == 1 else 0.0 for x, k in zip(r["logprobs"], r["loss_mask"])]
    hist = run.history[-1]
    assert hist["rollout/turns_mean"] == 2.0 and hist["rollout/tool_calls_mean"] == 1.0
    from wandb_tables import logged_tables

    tables = logged_tables(summary["wandb_dir"])
    assert "conversations" in tables, tables.keys()
    cols, rows = tables["conversations"]
    assert rows and [m["role"] for m in returned[0]["messages"]] == ["assistant", "user", "assistant"]
    row = dict(zip(cols, rows[0]))
    assert row["turns"] == 2 and row["stop_reason"] == "done" and "[user]  2+2=" in row["conversation"]


def test_sampling_that_differs_from_the_runs_is_refused():
    """The learner scores every token at rollout.temperature (top_p, top_k as the engine sampled):
    a call sampling otherwise would train on log-probs of another distribution."""
    import asyncio

    from grpo_dist.rollout.base import SamplingSpec
    from grpo_dist.rollout.user_fn import EngineClient

    run = SamplingSpec(n=2, temperature=0.7, top_p=0.9, top_k=20, max_tokens=8)
    client = EngineClient(None, None, [1, 2], run, 3, 64, None)
    for key, value in (("temperature", 1.0), ("top_p", 1.0), ("top_k", -1)):
        with pytest.raises(ValueError, match=rf"generate: {key}={value} differs from rollout.{key} "):
            asyncio.run(client.agenerate([1, 2], **{key: value}))
    same = client._spec([1, 2], 4, 0.7, 0.9, 20, None)
    assert (same.temperature, same.top_p, same.top_k, same.max_tokens) == (0.7, 0.9, 20, 4) and client.calls == 0


def test_after_one_trajectory_raises_its_siblings_and_their_threads_end(pretrained_model_dir):
    import threading
    import time

    recs = make_task("add", 2, seed=5, split="eval")
    w = _worker(pretrained_model_dir, rollout_fn=f"{HELPERS}:fail_on",
                rollout_fn_kwargs={"answer": str(recs[0].answer)})
    try:
        with pytest.raises(RolloutFnError, match=r"fail_on' raised on record .*a bug in the rollout function"):
            w.generate(recs, keys=[(0, 1, i) for i in range(2)])
        deadline = time.monotonic() + 20
        while any(t.name == "env-fail_on" for t in threading.enumerate()) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not [t for t in threading.enumerate() if t.name == "env-fail_on"], "sibling threads still blocked"
        w.cfg.rollout.rollout_fn_kwargs = {"answer": "none"}  # the worker still generates afterwards
        from grpo_dist.rollout.user_fn import UserRollouts

        w.user_fn = UserRollouts.from_config(w.cfg.rollout)
        assert len(w.generate(recs[:1], keys=[(0, 1, 0)])[0].rollouts) == 2
    finally:
        w.close()
