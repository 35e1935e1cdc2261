"""Environments: what a trajectory talks to between generations.

An :class:`~grpo_dist.envs.base.Env` is made per trajectory (``rollout.env``); the rollout
worker generates, hands the assistant's text to ``step``, appends the messages it answers with
as tokens the model did not sample (loss mask 0), and generates again until ``done``. The
default, :class:`~grpo_dist.envs.single_turn.SingleTurn`, ends after the first completion:
today's one-prompt-one-completion GRPO.
"""

from grpo_dist.envs.base import Env, EnvStep, make_env
from grpo_dist.envs.single_turn import SingleTurn

__all__ = ["Env", "EnvStep", "SingleTurn", "make_env"]
