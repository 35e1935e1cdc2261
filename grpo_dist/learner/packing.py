"""Group packing: a group's prompt once, its completions after it, no padding between.

GRPO samples G completions of every prompt, and the padded layout (``batching.collate``) runs the
prompt G times and pads every completion to the longest. Packed, a prompt is followed by its
completions, each with the positions it would have in its own sequence::

    row:       p0 p1 p2 | a0 a1 a2 a3 | b0 b1 | c0 c1 c2 | q0 q1 | d0 d1 ...
    positions:  0  1  2 |  3  4  5  6 |  3  4 |  3  4  5 |  0  1 |  2  3 ...

and every completion token attends to its prompt and the earlier tokens of its own completion
only. The logits are therefore those of the padded layout (to float rounding), and so are the
gradients: the prompt's activations feed every completion, and backward sums their contributions.
Two layouts:

* ``group`` (``learner.packing: auto`` first): every prompt group of the micro-batch in one row,
  and the attention computed per group by ``group_attention`` (never over the whole row);
* ``mask``: a row per prompt group of at most ``max_len`` tokens (the model's hidden size by
  default), padded to the longest row, with a 4-D additive mask over the row (``O(row^2)``).

The first token of a completion is predicted by the prompt's last position (shared by its
group's completions); every later token by the position before it, as in a plain sequence.

The mask layout runs each prompt once instead of G times; the group layout also drops the row
padding and most of the mask layout's attention work (benchmarks/NOTES.md has the figures), and
asks the model for the logits of the positions that score a completion token only (``kept_pos``,
passed as ``logits_to_keep``): an agent segment's long prompt costs no vocabulary-sized logits.

The learner checks the layouts once at set-up against the padded one on its own model (an
attention implementation that ignores a 4-D mask, e.g. flash-attention, fails the check) and
falls back, saying why (``layout.Layout.choose``).
"""

from __future__ import annotations

from typing import Optional

import torch

from grpo_dist.algo import entropy_from_logits, selective_log_softmax
from grpo_dist.types import TrainBatch

from .batching import Collated


def plan_rows(prompts: list[tuple[int, ...]], lens: list[int], max_len: int) -> list[tuple[int, list[int]]]:
    """Rows of ``(prompt length, [batch rows])``: consecutive sequences with the same prompt share
    a row while it stays within ``max_len`` tokens (a row holds at least one completion)."""
    rows: list[tuple[int, list[int]]] = []
    cur: list[int] = []
    size = 0
    for i, (p, n) in enumerate(zip(prompts, lens)):
        if cur and prompts[cur[0]] == p and size + n <= max_len:
            cur.append(i)
            size += n
            continue
        if cur:
            rows.append((len(prompts[cur[0]]), cur))
        cur, size = [i], len(p) + n
    if cur:
        rows.append((len(prompts[cur[0]]), cur))
    return rows


def collate_packed(batch: TrainBatch, rows: Optional[range] = None, pad_id: int = 0, max_len: int = 512,
                   mask_dtype: torch.dtype = torch.float32, group: bool = False) -> Collated:
    """Pack rows ``rows`` (default all) of ``batch``; the per-token tensors are laid out as in
    :func:`grpo_dist.learner.batching.collate` (``[B, C]``, column j = completion token j).

    ``group``: every prompt group in one row, no padding, and instead of the 4-D mask a
    :class:`~grpo_dist.learner.group_attention.GroupLayout` for group attention (``max_len`` unused)."""
    from .batching import collate

    rows = range(len(batch)) if rows is None else rows
    padded = collate(batch, rows, pad_id)  # the per-completion tensors (and the input checks)
    prompts = [tuple(batch.prompt_ids[i]) for i in rows]
    comps = [list(batch.completion_ids[i]) for i in rows]
    plan = plan_rows(prompts, [len(c) for c in comps], 1 << 62 if group else max_len)
    placed = [plan] if group else [[seg] for seg in plan]  # the segments of each packed row
    L = max(sum(n + sum(len(comps[b]) for b in members) for n, members in segs) for segs in placed)
    R, B, C = len(placed), len(comps), padded.index.shape[1]

    input_ids = torch.full((R, L), pad_id, dtype=torch.long)
    position_ids = torch.zeros((R, L), dtype=torch.long)
    # segment of each position (mask layout): 0 = prompt, k >= 1 = the k-th completion, -1 - q = padding at q
    seg = torch.full((R, L), 0, dtype=torch.long) - 1 - torch.arange(L)
    row_of = torch.zeros(B, dtype=torch.long)
    first_pos = torch.zeros(B, dtype=torch.long)  # the prompt's last position (predicts token 0)
    first_tok = torch.zeros(B, dtype=torch.long)
    index = torch.zeros((B, C), dtype=torch.long)  # window column (logits[:, :-1]) predicting token j
    spans: list[tuple[int, list[tuple[int, int]]]] = []  # group layout: (prompt start, [(start, len)])
    # group layout (one row): the position scoring each completion token, in batch order: its
    # prompt's last one for token 0 (once per completion: a group's completions start differently),
    # the one before it for the rest
    kept_pos: list[int] = []
    kept_tok: list[int] = []
    kept_col = torch.zeros((B, C), dtype=torch.long)
    for r, segs in enumerate(placed):
        off = 0
        for n, members in segs:
            p0 = off
            input_ids[r, p0:p0 + n] = torch.tensor(prompts[members[0]], dtype=torch.long)
            position_ids[r, p0:p0 + n] = torch.arange(n)
            seg[r, p0:p0 + n] = 0
            off += n
            span = []
            for k, b in enumerate(members, start=1):
                c = comps[b]
                m = len(c)
                row_of[b], first_pos[b] = r, p0 + n - 1
                span.append((off, m))
                if m == 0:
                    continue
                input_ids[r, off:off + m] = torch.tensor(c, dtype=torch.long)
                position_ids[r, off:off + m] = torch.arange(n, n + m)
                seg[r, off:off + m] = k
                first_tok[b] = c[0]
                index[b, :m] = torch.arange(off - 1, off - 1 + m)
                index[b, 0] = p0 + n - 1  # (logits at the prompt end; replaced by first_logp below anyway)
                if group:
                    kept_col[b, :m] = torch.arange(len(kept_pos), len(kept_pos) + m)
                    kept_pos += [p0 + n - 1] + list(range(off, off + m - 1))
                    kept_tok += c
                off += m
            spans.append((r * L + p0, [(r * L + st, m) for st, m in span]))

    kept: dict[str, torch.Tensor] = {}
    if group:
        from .group_attention import build_layout

        layout = build_layout(spans, [n for n, _ in plan])
        attn = torch.zeros((R, 1, 1, 1), dtype=mask_dtype)  # a 4-D placeholder: transformers passes it as is
        if not kept_pos:  # no completion tokens at all: one position, its value masked out
            kept_pos, kept_tok = [0], [pad_id]
        kept = {"kept_pos": torch.tensor(kept_pos, dtype=torch.long),
                "kept_tok": torch.tensor([kept_tok], dtype=torch.long), "kept_col": kept_col}
    else:
        q = torch.arange(L)
        causal = q[None, :] <= q[:, None]  # [L(query), L(key)]
        sees = (seg[:, None, :] == seg[:, :, None]) | ((seg[:, None, :] == 0) & (seg[:, :, None] >= 0))
        allowed = causal[None] & sees  # [R, Lq, Lk]; padding sees itself only (no empty softmax row)
        neg = torch.finfo(mask_dtype).min
        attn = torch.zeros((R, 1, L, L), dtype=mask_dtype).masked_fill_(~allowed[:, None], neg)
        layout = None

    return Collated(input_ids, attn, 0, index, padded.mask, padded.valid, padded.advantages,
                    padded.behaviour_logp, padded.lengths, position_ids=position_ids, row=row_of,
                    first_pos=first_pos, first_tok=first_tok, groups=layout,
                    tokens=sum(n + sum(len(comps[b]) for b in members) for n, members in plan), **kept)


def packed_token_values(logits: torch.Tensor, mb: Collated, entropy: bool = False):
    """Per-completion-token log-probs ``[B, C]`` (and entropies, no grad) from packed logits
    ``[R, L, V]`` (already temperature-scaled); 0 where not valid."""
    window = logits[:, :-1]
    win_lp = selective_log_softmax(window, mb.input_ids[:, 1:])  # [R, L-1]: each position's next token
    ends = logits[mb.row, mb.first_pos]  # [B, V]: the prompt end of each completion's row
    first = selective_log_softmax(ends, mb.first_tok)  # [B]
    logp = _per_completion(win_lp, first, mb)
    ent = None
    if entropy:
        with torch.no_grad():
            ent = _per_completion(entropy_from_logits(window.detach()), entropy_from_logits(ends.detach()), mb)
    return logp, ent


def kept_token_values(logits: torch.Tensor, mb: Collated, entropy: bool = False):
    """Per-completion-token log-probs ``[B, C]`` (and entropies, no grad) from the kept logits
    ``[1, K, V]`` (``Collated.kept_pos``; already temperature-scaled); 0 where not valid."""
    logp = _kept_per_completion(selective_log_softmax(logits, mb.kept_tok), mb)
    ent = None
    if entropy:
        with torch.no_grad():
            ent = _kept_per_completion(entropy_from_logits(logits.detach()), mb)
    return logp, ent


def _kept_per_completion(values: torch.Tensor, mb: Collated) -> torch.Tensor:
    out = values.reshape(-1)[mb.kept_col]  # [B, C]
    return torch.where(mb.valid, out, torch.zeros((), dtype=out.dtype, device=out.device))


def _per_completion(per_pos: torch.Tensor, first: torch.Tensor, mb: Collated) -> torch.Tensor:
    out = per_pos[mb.row].gather(1, mb.index)  # [B, C]
    col0 = torch.zeros_like(out, dtype=torch.bool)
    col0[:, 0] = True
    out = torch.where(col0, first[:, None].to(out.dtype), out)
    return torch.where(mb.valid, out, torch.zeros((), dtype=out.dtype, device=out.device))
