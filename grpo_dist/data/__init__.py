"""Prompt data: local files, saved HF datasets and built-in synthetic tasks.

Every source yields :class:`PromptRecord` objects: the text fed to the model (chat template
already applied when requested) plus the dataset's other columns (``answer`` among them),
which reward functions receive as keyword arguments.
"""

from __future__ import annotations

from grpo_dist.data.sources import PromptStream, load_prompts
from grpo_dist.data.synthetic import (
    Task,
    get_task,
    make_task,
    noisy_completion,
    register_task,
    task_names,
)
from grpo_dist.types import PromptRecord

from grpo_dist.data import env_tasks  # noqa: E402,F401  (registers tool_problems, guess_number)
from grpo_dist.data import ood_tasks  # noqa: E402,F401  (registers word_problems_ood, tool_problems_ood)

__all__ = [
    "PromptRecord",
    "PromptStream",
    "Task",
    "get_task",
    "load_prompts",
    "make_task",
    "noisy_completion",
    "register_task",
    "task_names",
]
