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


class ToolScript:
    """A scripted tool environment: turn 1 gets a tool result, turn 2 a failed call's error (both
    counted in ``info``), turn 3 ends it with a reward from the text's length (so a group's rewards
    differ). ``sleep_s``: each step sleeps first (a hung tool)."""

    def __init__(self, sleep_s: float = 0.0, turns: int = 3):
        self.sleep_s, self.turns, self.n = sleep_s, turns, 0

    def reset(self, record):
        return None  # the record's prompt as the data pipeline rendered it

    def step(self, completion: str) -> EnvStep:
        import time

        time.sleep(self.sleep_s)
        self.n += 1
        if self.n >= self.turns:
            return EnvStep(reward=float(len(completion) % 2), done=True)
        if self.n == 1:
            return EnvStep([{"role": "tool", "content": "4"}], info={"tool_calls": 1})
        return EnvStep([{"role": "tool", "content": "Error: bad"}], info={"tool_calls": 1, "tool_errors": 1})
