"""Ragged ``TrainBatch`` rows -> padded tensors aligned with the model's predicted positions.

Each sequence is ``prompt_ids + completion_ids``, right-padded to ``L``. Logits at position ``t``
predict token ``t + 1``, so completion token ``j`` of row ``b`` is scored by the logits at
``prompt_len[b] + j - 1``. Positions before ``start = min(prompt_len) - 1`` never score a
completion token, so the model is asked for the last ``L - start`` logits only
(``logits_to_keep``); ``index[b, j]`` is the column of that window scoring completion token ``j``.

Per-token tensors of the loss are ``[B, C]`` with ``C`` = longest completion in the micro-batch;
column ``j`` is completion token ``j`` (so ``loss_mask`` and behaviour log-probs line up as is).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import torch

from grpo_dist.types import TrainBatch


@dataclass
class Collated:
    """One padded micro-batch (CPU tensors; ``to(device)`` moves them)."""

    input_ids: torch.Tensor  # [B, L] long, right-padded
    attention_mask: torch.Tensor  # [B, L] long
    start: int  # first kept logits position; logits_to_keep = L - start
    index: torch.Tensor  # [B, C] long: column of the kept-logits window (after [:, :-1])
    mask: torch.Tensor  # [B, C] float: loss mask over completion tokens (0 on padding)
    valid: torch.Tensor  # [B, C] bool: real completion tokens (loss mask or not)
    advantages: torch.Tensor  # [B] float32
    behaviour_logp: Optional[torch.Tensor]  # [B, C] float32 or None
    lengths: list[int]  # completion lengths
    # group packing (grpo_dist.learner.packing): rows hold a prompt and several of its completions,
    # attention_mask is then a 4-D additive mask [R, 1, L, L] and input_ids [R, L]
    position_ids: Optional[torch.Tensor] = None  # [R, L] long
    row: Optional[torch.Tensor] = None  # [B] long: the packed row of each completion
    first_pos: Optional[torch.Tensor] = None  # [B] long: its prompt's last position in that row
    first_tok: Optional[torch.Tensor] = None  # [B] long: its first token
    groups: Any = None  # group attention (grpo_dist.learner.group_attention.GroupLayout): replaces the 4-D mask
    tokens: int = 0  # the real (not padding) tokens the layout runs through the model (the FLOP count's)

    @property
    def packed(self) -> bool:
        return self.row is not None

    @property
    def logits_to_keep(self) -> int:
        return int(self.input_ids.shape[1] - self.start)

    def targets(self) -> torch.Tensor:
        """``[B, L - start - 1]``: the token each kept logits position (but the last) predicts."""
        return self.input_ids[:, self.start + 1:]

    def to(self, device) -> "Collated":
        def mv(x):
            return x.to(device) if hasattr(x, "to") else x  # tensors and the group layout

        return Collated(**{k: mv(v) for k, v in self.__dict__.items()})


def collate(batch: TrainBatch, rows: Optional[range] = None, pad_id: int = 0) -> Collated:
    """Pad rows ``rows`` (default all) of ``batch``.

    Raises ValueError for an empty prompt (nothing would predict the first completion token) or a
    ``loss_mask`` / ``behaviour_logprobs`` row whose length differs from its completion.
    """
    rows = range(len(batch)) if rows is None else rows
    if len(rows) == 0:
        raise ValueError("collate: empty micro-batch")
    prompts = [list(batch.prompt_ids[i]) for i in rows]
    comps = [list(batch.completion_ids[i]) for i in rows]
    if any(len(p) == 0 for p in prompts):
        raise ValueError("collate: every sequence needs at least one prompt token")
    lens = [len(c) for c in comps]
    b = len(rows)
    seq_len = max(len(p) + len(c) for p, c in zip(prompts, comps))
    c_max = max(1, max(lens))
    start = min(len(p) for p in prompts) - 1

    input_ids = torch.full((b, seq_len), pad_id, dtype=torch.long)
    attn = torch.zeros((b, seq_len), dtype=torch.long)
    index = torch.zeros((b, c_max), dtype=torch.long)
    mask = torch.zeros((b, c_max), dtype=torch.float32)
    valid = torch.zeros((b, c_max), dtype=torch.bool)
    have_behaviour = bool(batch.behaviour_logprobs)  # none at all: the batch carries no behaviour log-probs
    if have_behaviour:
        for i, k in zip(rows, lens):
            if len(batch.behaviour_logprobs[i]) != k:
                raise ValueError(f"collate: behaviour_logprobs row {i} has {len(batch.behaviour_logprobs[i])} "
                                 f"values for {k} completion tokens")
    behaviour = torch.zeros((b, c_max), dtype=torch.float32) if have_behaviour else None

    for r, (i, p, c) in enumerate(zip(rows, prompts, comps)):
        n = len(p) + len(c)
        input_ids[r, :n] = torch.tensor(p + c, dtype=torch.long)
        attn[r, :n] = 1
        if not c:
            continue
        k = len(c)
        index[r, :k] = torch.arange(len(p) - 1 - start, len(p) - 1 - start + k)
        valid[r, :k] = True
        if batch.loss_mask is not None:
            lm = batch.loss_mask[i]
            if len(lm) != k:
                raise ValueError(f"collate: loss_mask row {i} has {len(lm)} values for {k} completion tokens")
            mask[r, :k] = torch.tensor(lm, dtype=torch.float32)
        else:
            mask[r, :k] = 1.0
        if behaviour is not None:
            behaviour[r, :k] = torch.tensor(batch.behaviour_logprobs[i], dtype=torch.float32)

    adv = torch.tensor([float(batch.advantages[i]) for i in rows], dtype=torch.float32)
    return Collated(input_ids, attn, start, index, mask, valid, adv, behaviour, lens,
                    tokens=sum(len(p) for p in prompts) + sum(lens))


def micro_batch_rows(n: int, num_micro: int) -> list[range]:
    """Split ``n`` rows into ``num_micro`` contiguous, near-equal, non-empty ranges."""
    if num_micro < 1 or n < num_micro:
        raise ValueError(f"cannot split {n} sequences into {num_micro} micro-batches")
    return [range(n * k // num_micro, n * (k + 1) // num_micro) for k in range(num_micro)]


def gather_completion(window: torch.Tensor, index: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """``[B, W]`` per-position values -> ``[B, C]`` per-completion-token values (0 where not valid)."""
    out = window.gather(1, index)
    return torch.where(valid, out, torch.zeros((), dtype=out.dtype, device=out.device))


def range_tokens(batch: TrainBatch, rows: range, packed: bool) -> int:
    """The tokens the rows ``rows`` run through the model: packed, every completion and a prompt
    once per run of consecutive rows sharing it; padded, the rows times the longest sequence."""
    if not packed:
        return len(rows) * max(len(batch.prompt_ids[i]) + len(batch.completion_ids[i]) for i in rows)
    total, prev = 0, None
    for i in rows:
        p = batch.prompt_ids[i]
        if prev is None or list(p) != list(prev):
            total += len(p)
        total += len(batch.completion_ids[i])
        prev = p
    return total


def token_micro_batches(batch: TrainBatch, budget: int, packed: bool, count: Optional[int] = None) -> list[range]:
    """``learner.micro_batch_tokens``: contiguous ranges of rows, each running at most ``budget``
    tokens (``range_tokens``; a longer sequence alone), filled greedily in order. ``count``: exactly
    that many ranges (:func:`split_micro_batches`)."""
    parts: list[range] = []
    start, cost, longest = 0, 0, 0
    for i in range(len(batch)):  # range_tokens(start .. i), kept as it grows (one pass, not one sum per row)
        p = batch.prompt_ids[i]
        seq = len(p) + len(batch.completion_ids[i])
        shared = i > start and list(p) == list(batch.prompt_ids[i - 1])  # packed: its prompt is in already
        grown = cost + seq - (len(p) if shared else 0) if packed else (i - start + 1) * max(longest, seq)
        if i > start and grown > budget:  # row i opens the next micro-batch
            parts.append(range(start, i))
            start, grown, longest = i, seq, 0
        cost, longest = grown, max(longest, seq)
    if len(batch):
        parts.append(range(start, len(batch)))
    return parts if count is None else split_micro_batches(batch, parts, count, packed, budget)


def split_micro_batches(batch: TrainBatch, parts: list[range], count: int, packed: bool,
                        budget: int) -> list[range]:
    """``parts`` (:func:`token_micro_batches` of ``budget``) made exactly ``count`` ranges, the
    costliest split at its token midpoint until there are (every rank runs the largest rank's
    count); a count below ``len(parts)``, or above the rows, raises ValueError."""
    n = len(batch)
    if count > n:
        raise ValueError(f"cannot split into {count} micro-batches of {n} sequences")
    if count < len(parts):
        raise ValueError(f"{count} micro-batches are fewer than the {len(parts)} a budget of {budget} tokens needs")
    parts = list(parts)
    while len(parts) < count:
        k = max((j for j, r in enumerate(parts) if len(r) > 1), key=lambda j: range_tokens(batch, parts[j], packed))
        r = parts[k]
        half = range_tokens(batch, r, packed) / 2
        cut = next((c for c in range(r.start + 1, r.stop) if range_tokens(batch, range(r.start, c), packed) >= half),
                   r.stop - 1)
        parts[k:k + 1] = [range(r.start, cut), range(cut, r.stop)]
    return parts
