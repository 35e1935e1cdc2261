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

import collections
import heapq
from dataclasses import dataclass
from typing import Any, Iterator, Optional

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
    # the group layout's kept logits (packing.collate_packed): one position per completion token, in
    # batch order, so the model's vocabulary-sized logits skip the prompts' positions
    kept_pos: Optional[torch.Tensor] = None  # [K] long: the row position whose logits score token k
    kept_tok: Optional[torch.Tensor] = None  # [1, K] long: token k
    kept_col: Optional[torch.Tensor] = None  # [B, C] long: k of completion token j of row b (0 past its end)
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
    """Split ``n`` rows into ``num_micro`` contiguous, near-equal ranges, non-empty while there are
    rows: with fewer rows than ``num_micro`` (a rank's uneven shard), one row each and then empty
    ranges ``range(n, n)`` (micro-batches that train on nothing: :func:`idle_batch`)."""
    if num_micro < 1:
        raise ValueError(f"cannot split {n} sequences into {num_micro} micro-batches")
    if n < num_micro:
        return [range(i, i + 1) for i in range(n)] + [range(n, n)] * (num_micro - n)
    return [range(n * k // num_micro, n * (k + 1) // num_micro) for k in range(num_micro)]


def idle_batch(batch: TrainBatch, pad_id: int) -> TrainBatch:
    """The micro-batch of an empty range: one two-token sequence with loss mask 0 and advantage 0
    (and a behaviour log-prob where ``batch`` has them). A rank short of rows runs it so that every
    rank runs the same number of backward passes (ZeRO-2/3 reduce gradients in each); its loss and
    gradient are exactly 0 and its counts (tokens, sequences) 0."""
    return TrainBatch(prompt_ids=[[pad_id]], completion_ids=[[pad_id]],
                      behaviour_logprobs=[[0.0]] if batch.behaviour_logprobs else [], advantages=[0.0],
                      loss_mask=[[0.0]])


def gather_completion(window: torch.Tensor, index: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """``[B, W]`` per-position values -> ``[B, C]`` per-completion-token values (0 where not valid)."""
    out = window.gather(1, index)
    return torch.where(valid, out, torch.zeros((), dtype=out.dtype, device=out.device))


def _shared_prompts(batch: TrainBatch) -> list[bool]:
    """Whether each row's prompt is the previous row's (one comparison per row, made once)."""
    p = batch.prompt_ids
    return [i > 0 and list(p[i]) == list(p[i - 1]) for i in range(len(batch))]


def _growing_tokens(batch: TrainBatch, start: int, stop: int, packed: bool, pack_len: int,
                    shared: Optional[list[bool]] = None) -> Iterator[int]:
    """``range_tokens(batch, range(start, i + 1), packed, pack_len)`` for ``i = start .. stop - 1``,
    one row at a time (O(1) each, given ``shared``: :func:`_shared_prompts`)."""
    cost = size = longest = 0
    for i in range(start, stop):
        p, n = len(batch.prompt_ids[i]), len(batch.completion_ids[i])
        if not packed:
            longest = max(longest, p + n)
            cost = (i - start + 1) * longest
        elif i > start and (shared[i] if shared is not None else list(batch.prompt_ids[i]) == list(
                batch.prompt_ids[i - 1])) and (not pack_len or size + n <= pack_len):
            cost, size = cost + n, size + n  # in the packed row of its prompt
        else:
            cost, size = cost + p + n, p + n  # a new packed row: its prompt first
        yield cost


def range_tokens(batch: TrainBatch, rows: range, packed: bool, pack_len: int = 0) -> int:
    """The tokens the rows ``rows`` run through the model. Packed, every completion, and the prompt
    once per packed row (``packing.plan_rows``): the group layout (``pack_len`` 0) once per run of
    consecutive rows sharing it; the mask layout (rows of at most ``pack_len`` tokens) again in each
    row a longer group spills into -- the real tokens ``Collated.tokens`` counts (not the mask
    layout's padding of its rows to the longest). Padded: the rows times the longest sequence."""
    return _last(_growing_tokens(batch, rows.start, rows.stop, packed, pack_len))


def token_micro_batches(batch: TrainBatch, budget: int, packed: bool, count: Optional[int] = None,
                        pack_len: int = 0) -> list[range]:
    """``learner.micro_batch_tokens``: contiguous ranges of rows, each running at most ``budget``
    tokens (``range_tokens``; a longer sequence alone), filled greedily in order. ``count``: exactly
    that many ranges (:func:`split_micro_batches`). ``pack_len``: the mask layout's row length."""
    parts: list[range] = []
    shared = _shared_prompts(batch) if packed else None
    start, n = 0, len(batch)
    while start < n:  # one pass: each row is costed once (the one that opens the next range twice)
        stop = start + 1
        for i, cost in enumerate(_growing_tokens(batch, start, n, packed, pack_len, shared), start):
            if i > start and cost > budget:  # row i opens the next micro-batch
                break
            stop = i + 1
        parts.append(range(start, stop))
        start = stop
    return parts if count is None else split_micro_batches(batch, parts, count, packed, budget, pack_len)


def split_micro_batches(batch: TrainBatch, parts: list[range], count: int, packed: bool,
                        budget: int, pack_len: int = 0) -> list[range]:
    """``parts`` (:func:`token_micro_batches` of ``budget``) made exactly ``count`` ranges (every
    rank runs the largest rank's count): the costliest range (the first of equals) split at its
    token midpoint (the first cut with at least half its tokens before it) until there are
    ``count``, or one row each; past the rows, empty ranges ``range(n, n)`` after them (a rank with
    fewer rows than ``count``: :func:`idle_batch`). A count below ``len(parts)`` raises ValueError.
    Linear in the rows of the range split, per split (a heap keeps the costliest)."""
    if count < len(parts):
        raise ValueError(f"{count} micro-batches are fewer than the {len(parts)} a budget of {budget} tokens needs")
    n = len(batch)
    shared = _shared_prompts(batch) if packed else None

    def tokens(a: int, b: int) -> int:
        return _last(_growing_tokens(batch, a, b, packed, pack_len, shared))

    by_start = {r.start: r for r in parts}
    heap = [(-tokens(r.start, r.stop), r.start, r.stop) for r in parts if len(r) > 1]
    heapq.heapify(heap)
    for _ in range(min(count, n) - len(parts)):
        neg, a, b = heapq.heappop(heap)  # the costliest, the first of equals (its start is the smallest)
        half, cut, left = -neg / 2, b - 1, 0
        for c, t in enumerate(_growing_tokens(batch, a, b - 1, packed, pack_len, shared), a + 1):
            left = t  # tokens of rows a .. c - 1
            if t >= half:
                cut = c
                break
        by_start[a], by_start[cut] = range(a, cut), range(cut, b)
        for lo, hi, cost in ((a, cut, left), (cut, b, None)):
            if hi - lo > 1:
                heapq.heappush(heap, (-(cost if cost is not None else tokens(lo, hi)), lo, hi))
    out = [by_start[s] for s in sorted(by_start)]
    return out + [range(n, n)] * (count - len(out))


def _last(costs: Iterator[int]) -> int:
    """The last of a :func:`_growing_tokens` sequence (0 for none)."""
    last = collections.deque(costs, maxlen=1)
    return last[0] if last else 0
