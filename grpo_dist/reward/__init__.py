"""Reward functions: builtin families, plug-in lookup and the robust reward worker.

Reward functions have TRL's signature ``fn(prompts, completions, **dataset_columns) ->
list[float]``; config entries name them as builtins (``correctness``, ``math``, ``format``,
``length``, ``pattern``, ``composite``), ``module.path:function`` or ``path/to/file.py:function``.
"""

from grpo_dist.reward.registry import (
    NamedReward,
    build_reward_fns,
    builtin_names,
    get_reward_fn,
    register_reward,
)
from grpo_dist.reward.builtin import (  # noqa: E402  (registers the builtins)
    completion_text,
    composite_reward,
    correctness_reward,
    extract_answer,
    format_reward,
    length_reward,
    pattern_reward,
)
from grpo_dist.reward.math_answer import extract_math_answer, math_reward  # noqa: E402
from grpo_dist.reward.worker import RewardWorker  # noqa: E402

__all__ = [
    "NamedReward",
    "RewardWorker",
    "build_reward_fns",
    "builtin_names",
    "completion_text",
    "composite_reward",
    "correctness_reward",
    "extract_answer",
    "extract_math_answer",
    "format_reward",
    "get_reward_fn",
    "length_reward",
    "math_reward",
    "pattern_reward",
    "register_reward",
]
