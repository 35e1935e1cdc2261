"""Scripted environments for tests (``rollout.env: grpo_dist.testing.envs:TwoTurns``)."""

from __future__ import annotations

from grpo_dist.envs.base import EnvStep


class TwoTurns:
    """Answers the first assistant turn with ``reply`` (a user message), ends after the second.
    Keeps what it was sent (one instance per trajectory)."""

    def __init__(self, reply: str = " 2+2="):
        self.reply, self.seen = reply, []

    def reset(self, record):
        return None

    async def step(self, completion: str) -> EnvStep:  # async, as environments may be
        self.seen.append(completion)
        if len(self.seen) == 1:
            return EnvStep(messages=[{"role": "user", "content": self.reply}])
        return EnvStep(reward=1.0, done=True, info={"turns": len(self.seen)})


class Raises:
    """An environment whose ``step`` raises every time (a tool server that is down)."""

    def reset(self, record):
        return None

    def step(self, completion: str) -> EnvStep:
        raise ConnectionError("tool server down (404)")
