"""Environments: what a trajectory talks to between generations.

An :class:`~grpo_dist.envs.base.Env` is made per trajectory (``rollout.env``, or per record by
``rollout.env_column``); the rollout worker generates, hands the assistant's text to ``step``,
appends the messages it answers with as tokens the model did not sample (loss mask 0), and
generates again until ``done`` or a limit (grpo_dist/rollout/turns.py). The default,
:class:`~grpo_dist.envs.single_turn.SingleTurn`, ends after the first completion: today's
one-prompt-one-completion GRPO.

* ``base``: the protocol, :class:`EnvLimits`, the registry, :class:`EnvSource`, the event loop;
* ``tools``: plain tool functions and TRL-style environment classes (:class:`ToolEnv`, :class:`TRLEnv`);
* ``parsers``: tool-call formats (Hermes);
* ``chat``: the chat template's token pieces, its prefix check, the sanity comparison;
* ``sandbox``: the code tool's separate, limited process;
* ``builtin``: calculator, python_code, guess_number; ``rewards``: reward functions over their columns.
"""

from grpo_dist.envs.base import Env, EnvLimits, EnvStep, register_env
from grpo_dist.envs.registry import EnvSource, env_factory, make_env
from grpo_dist.envs.single_turn import SingleTurn

__all__ = ["Env", "EnvLimits", "EnvSource", "EnvStep", "SingleTurn", "env_factory", "make_env", "register_env"]
