"""Prompt data: local files, saved HF datasets and built-in synthetic tasks.

Every source yields :class:`PromptRecord` objects: the text fed to the model (chat template
already applied when requested) plus the dataset's other columns (``answer`` among them),
which reward functions receive as keyword arguments.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class PromptRecord:
    """One prompt: ``id`` (position in its source), ``prompt`` (model input text) and
    ``columns`` (``answer`` and any other dataset columns, passed on to the rewards)."""

    id: int
    prompt: str
    columns: dict[str, Any] = field(default_factory=dict)

    @property
    def answer(self) -> Any:
        """The reference answer (``columns["answer"]``), or None when the source has none."""
        return self.columns.get("answer")

    def as_example(self) -> dict[str, Any]:
        """The plain dict form ``{"prompt": ..., "answer": ..., **other_columns}``."""
        return {"prompt": self.prompt, **self.columns}


from grpo_dist.data.sources import PromptStream, load_prompts  # noqa: E402
from grpo_dist.data.synthetic import (  # noqa: E402
    Task,
    get_task,
    make_task,
    noisy_completion,
    register_task,
    task_names,
)

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
