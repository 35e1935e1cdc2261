"""Scripted environments for tests that load them by file (``rollout.env: <this file>:Class``)."""

from __future__ import annotations

from grpo_dist.envs.base import EnvStep


class Chatty:
    """Opens with the record's question; answers turn 1 with a tool result, turn 2 with a user
    message, ends at turn 3."""

    REPLIES = [[{"role": "tool", "name": "calculator", "content": "Result: 1344 apples (84 x 16)."}],
               [{"role": "user", "content": "Are you sure? Check 16 * 84 again, then answer."}]]

    def __init__(self, turns: int = 3):
        self.turns, self.seen = turns, []

    def reset(self, record):
        return [{"role": "user", "content": record.columns.get("question") or record.prompt}]

    def step(self, completion: str) -> EnvStep:
        self.seen.append(completion)
        if len(self.seen) >= self.turns:
            return EnvStep(reward=float(len(self.seen)), done=True)
        return EnvStep(messages=self.REPLIES[(len(self.seen) - 1) % len(self.REPLIES)])
