"""Reward functions over the columns a multi-turn rollout adds (grpo_dist/rollout/turns.py).

Name them in ``reward.functions`` as ``fn: grpo_dist.envs.rewards:<function>``.
"""

from __future__ import annotations

from typing import Any, Sequence


def env_reward(prompts: Sequence[Any], completions: Sequence[Any], env_reward: Sequence[Any] | None = None,
               **kwargs: Any) -> list[float]:
    """The environment's own reward (its step rewards summed, or what ``finish`` returned); 0.0
    where it gave none."""
    values = list(env_reward) if env_reward is not None else [None] * len(completions)
    return [float(v) if v is not None else 0.0 for v in values]


def tool_errors_penalty(prompts: Sequence[Any], completions: Sequence[Any], tool_errors: Sequence[Any] | None = None,
                        **kwargs: Any) -> list[float]:
    """Minus the number of failed or malformed tool calls of each trajectory (weight it small)."""
    values = list(tool_errors) if tool_errors is not None else [0] * len(completions)
    return [-float(v or 0) for v in values]


def tool_call_ok(prompts: Sequence[Any], completions: Sequence[Any], tool_calls: Sequence[Any] | None = None,
                 tool_errors: Sequence[Any] | None = None, **kwargs: Any) -> list[float]:
    """1.0 for a trajectory that called a tool and had no failed or malformed call, else 0.0: a
    small format bonus (weight it ~0.1) while the right answers are still rare."""
    n = len(completions)
    calls = list(tool_calls) if tool_calls is not None else [0] * n
    errors = list(tool_errors) if tool_errors is not None else [0] * n
    return [1.0 if int(c or 0) > 0 and not int(e or 0) else 0.0 for c, e in zip(calls, errors)]
