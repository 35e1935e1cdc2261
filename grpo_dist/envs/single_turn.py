"""The single-turn environment: the prompt, one completion, done (GRPO as the seeds describe it)."""

from __future__ import annotations

from typing import Any

from grpo_dist.envs.base import EnvStep, register_env


@register_env("single_turn")
class SingleTurn:
    def reset(self, record: Any) -> None:
        return None  # the record's prompt, as the data pipeline rendered it

    def step(self, completion: str) -> EnvStep:
        return EnvStep(done=True)
