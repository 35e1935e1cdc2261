"""The W&B tables of a step: ``samples`` (one completion per group) for single-turn runs,
``conversations`` (one trajectory per group, turn by turn) for multi-turn ones."""

from __future__ import annotations

from grpo_dist.types import RewardResult, RolloutGroup


def sample_rows(groups: list[RolloutGroup], scores: RewardResult, limit: int) -> list[list]:
    """Rows of the W&B sample table: one completion from each of the first groups."""
    rows = []
    flat = [(g, r) for g in groups for r in g.rollouts]
    for i, (g, r) in enumerate(flat):
        if i % len(g.rollouts) == 0 and len(rows) < limit:
            rows.append([r.prompt, r.completion, str(r.columns.get("answer", "")), float(scores.total[i]),
                         r.finish_reason, r.adapter_version])
    return rows


SAMPLE_COLUMNS = ["prompt", "completion", "answer", "reward", "finish_reason", "adapter_version"]
CONVERSATION_COLUMNS = ["prompt", "conversation", "roles", "answer", "reward", "stop_reason", "turns", "tool_calls",
                        "tool_errors", "adapter_version"]


def sample_table(groups: list[RolloutGroup], scores: RewardResult, limit: int) -> tuple[str, list[str], list[list]]:
    """The W&B table of a step: ``samples`` (one completion per group), or for multi-turn rollouts
    ``conversations``: one trajectory of each of the first groups, its turns as
    ``[role] text`` lines (assistant turns with their tool calls, tool results, injected user
    turns), the roles in order, its reward, stop reason, turns and tool counters."""
    if not any(r.loss_mask is not None for g in groups for r in g.rollouts):
        return "samples", SAMPLE_COLUMNS, sample_rows(groups, scores, limit)
    rows, i = [], 0
    for g in groups:
        if len(rows) < limit:
            r = g.rollouts[0]
            turns = r.messages if r.messages is not None else [{"role": "assistant", "content": r.completion}]
            rows.append([r.prompt, "\n".join(f"[{_who(m)}] {m.get('content', '')}" for m in turns),
                         " ".join(_who(m) for m in turns), str(r.columns.get("answer", "")), float(scores.total[i]),
                         r.stop_reason or r.finish_reason, r.turns, int(r.columns.get("tool_calls") or 0),
                         int(r.columns.get("tool_errors") or 0), r.adapter_version])
        i += len(g.rollouts)
    return "conversations", CONVERSATION_COLUMNS, rows


def _who(m: dict) -> str:
    return f"{m.get('role', '?')}:{m['name']}" if m.get("name") else str(m.get("role", "?"))
