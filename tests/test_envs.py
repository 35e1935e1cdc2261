"""Environments (grpo_dist/envs): the single-turn default is today's generation; a scripted
two-turn environment gives trajectories whose environment tokens have loss mask 0 at exactly
their positions, carried into the learner's batch (in-process rollout worker, transformers
backend, the demo's base model)."""

from __future__ import annotations

import pytest

from grpo_dist.batch import build_batch
from grpo_dist.config import ConfigError, load_config
from grpo_dist.data import make_task
from grpo_dist.envs import EnvStep, SingleTurn, make_env
from grpo_dist.reward.columns import check_rewards  # noqa: F401  (the reward registry, loaded)
from grpo_dist.rollout.worker import RolloutWorker
from grpo_dist.types import RewardResult


def _worker(model_dir, **rollout):
    cfg = load_config(None, {"model": {"path": str(model_dir)}, "lora": {"enabled": False},
                             "rollout": {"backend": "hf", "group_size": 2, "max_tokens": 8, **rollout}})
    w = RolloutWorker(cfg)
    w.setup()
    return w


@pytest.fixture(scope="module")
def workers(pretrained_model_dir):
    single = _worker(pretrained_model_dir)
    two = _worker(pretrained_model_dir, env="grpo_dist.testing.envs:TwoTurns", env_kwargs={"reply": " 2+2="})
    yield single, two
    single.close()
    two.close()


def test_single_turn_env_is_one_completion():
    env = make_env("single_turn")
    assert isinstance(env, SingleTurn) and env.reset(None) is None
    assert env.step("anything") == EnvStep(done=True)


def test_unknown_or_bad_environment_fails_in_the_config_check(tiny_model_dir):
    from grpo_dist.run import preflight

    with pytest.raises(ConfigError, match=r"rollout\.env: unknown environment 'chess'"):
        preflight.check(load_config(None, {"model": {"path": str(tiny_model_dir)}, "rollout": {"env": "chess"},
                                           "data": {"eval_path": None}}))
    # the streaming pipeline runs each trajectory on its own (rollout/turns_async.py); it needs vLLM
    load_config(None, {"rollout": {"streaming": True, "env": "grpo_dist.testing.envs:TwoTurns"}})
    with pytest.raises(ConfigError, match="rollout.streaming needs rollout.backend vllm"):
        load_config(None, {"rollout": {"streaming": True, "backend": "hf", "env": "grpo_dist.testing.envs:TwoTurns"}})


def test_two_turn_environment_masks_its_tokens_at_their_positions(workers):
    single, two = workers
    recs = make_task("add", 3, seed=5, split="eval")
    keys = [(0, 1, i) for i in range(3)]
    one = single.generate(recs, keys=keys)
    groups = two.generate(recs, keys=keys)
    # the demo tokenizer's chat template renders "role: content\n" per message: after the assistant's
    # turn (which the model ended with its EOS) the reply adds the glue, the user turn and the next
    # assistant header, as the template renders them
    assert "{{ message['role'] }}: {{ message['content'] }}" in two.engine.tokenizer.chat_template
    reply = two.engine.tokenizer("\nuser:  2+2=\nassistant: ", add_special_tokens=False)["input_ids"]
    for g1, g2 in zip(one, groups):
        assert g1.prompt_id == g2.prompt_id and len(g2.rollouts) == 2
        for r1, r2 in zip(g1.rollouts, g2.rollouts):
            assert r2.turns == 2 and r2.stop_reason == "done" and r1.finish_reason == "stop"
            n1 = len(r1.completion_ids)
            # turn 1 is exactly the single-turn completion (same seed), then the reply, then turn 2
            assert r2.completion_ids[:n1] == r1.completion_ids  # log-probs to rounding: another batch's kernels
            assert r2.logprobs[:n1] == pytest.approx(r1.logprobs, abs=1e-5)
            assert r2.completion_ids[n1:n1 + len(reply)] == reply
            n2 = len(r2.completion_ids) - n1 - len(reply)
            assert n2 >= 1
            assert r2.loss_mask == [1] * n1 + [0] * len(reply) + [1] * n2
            assert all(lp == 0.0 for lp, m in zip(r2.logprobs, r2.loss_mask) if m == 0)
            assert all(lp < 0.0 for lp, m in zip(r2.logprobs, r2.loss_mask) if m == 1)
            assert r2.prompt_ids == r1.prompt_ids  # the environment's reset kept the record's prompt

    cfg = two.cfg
    flat = [r for g in groups for r in g.rollouts]
    scores = RewardResult(total=[float(i % 2) for i in range(len(flat))], per_function={})
    batch, m = build_batch(groups, scores, 2, cfg.algo, cfg.rollout.max_tokens)
    assert batch.loss_mask == [[float(x) for x in r.loss_mask] for r in flat]  # carried to the learner
    assert m["rollout/turns_mean"] == 2.0 and m["rollout/stop_reason/done"] == len(flat)
    masked = sum(len(r.loss_mask) - sum(r.loss_mask) for r in flat)
    assert m["rollout/env_token_frac"] == pytest.approx(masked / sum(len(r.completion_ids) for r in flat))
