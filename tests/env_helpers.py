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


def two_calls(client, row, reply: str = " 2+2=", log: str | None = None) -> dict:
    """A user rollout function (``rollout.rollout_fn``): a turn of 4 tokens, a fixed user turn
    (loss mask 0), a turn of 3 tokens. ``log``: each result appended as a JSON line."""
    import json

    first = client.generate(client.prompt_ids, max_tokens=4)
    injected = client.tokenizer(reply, add_special_tokens=False)["input_ids"]
    second = client.generate(client.prompt_ids + first.token_ids + injected, max_tokens=3)
    out = {"completion_ids": first.token_ids + injected + second.token_ids,
           "loss_mask": [1] * len(first.token_ids) + [0] * len(injected) + [1] * len(second.token_ids),
           "logprobs": first.logprobs + [None] * len(injected) + second.logprobs,
           "reward": float(sum(second.token_ids) % 3), "info": {"tool_calls": 1},
           "messages": [{"role": "assistant", "content": first.text}, {"role": "user", "content": reply},
                        {"role": "assistant", "content": second.text}]}
    if log:
        with open(log, "a") as f:
            f.write(json.dumps({"prompt_ids": client.prompt_ids, "answer": row.get("answer"), **out}) + "\n")
    return out


async def two_calls_async(client, row, reply: str = " 2+2=") -> dict:
    """``two_calls`` as an ``async def`` (awaits ``client.agenerate``)."""
    first = await client.agenerate(client.prompt_ids, max_tokens=4)
    injected = client.tokenizer(reply, add_special_tokens=False)["input_ids"]
    second = await client.agenerate(client.prompt_ids + first.token_ids + injected, max_tokens=3)
    return {"completion_ids": first.token_ids + injected + second.token_ids,
            "loss_mask": [1] * len(first.token_ids) + [0] * len(injected) + [1] * len(second.token_ids),
            "logprobs": first.logprobs + [0.0] * len(injected) + second.logprobs}


def mask_too_short(client, row) -> dict:
    """A rollout function breaking the contract: one loss-mask entry short."""
    g = client.generate(client.prompt_ids, max_tokens=3)
    return {"completion_ids": g.token_ids, "loss_mask": [1] * (len(g.token_ids) - 1), "logprobs": g.logprobs}


def fail_on(client, row, answer: str = "", wait_s: float = 0.5) -> dict:
    """A user rollout function that raises on the rows whose answer is ``answer``; the others wait
    ``wait_s`` (so the failure comes first), then generate twice (``two_calls``)."""
    import time

    if str(row.get("answer")) == answer:
        raise RuntimeError("a bug in the rollout function")
    time.sleep(wait_s)
    return two_calls(client, row)


def swallows_errors(client, row) -> dict:
    """A user rollout function that catches every error of its generate call and returns an empty
    trajectory ending as env_error (an engine error must still fail the call)."""
    try:
        return two_calls(client, row)
    except Exception:  # noqa: BLE001 - what a careless function does
        return {"completion_ids": [], "loss_mask": [], "logprobs": [], "stop_reason": "env_error"}
