"""Group attention: the packed layout's attention computed block by block, never ``O(row^2)``.

A packed micro-batch (``grpo_dist.learner.packing``) holds each prompt once with its G completions
after it. With a 4-D mask every query scores every key of its row, although a completion token
only attends to its prompt and the earlier tokens of its own completion, so most of the scores
computed are thrown away (benchmarks/NOTES.md has the profile). Here the attention is two dense batches:

    prompts:      [prompts, heads, P, D]      over their own keys, causal
    completions:  [completions, heads, C, D]  over keys [its prompt (P) | its own tokens (C)],
                                              causal on the own part

gathered from the row by index and written back to their positions (``index_copy``). Scores:
``G * C * (P + C)`` per group instead of ``(P + G * C)^2``, so a micro-batch can be one row of
any length (no padding between groups). Gradients flow through the gathers (a prompt key
gathered by G completions accumulates their G gradients), so the result is the padded layout's,
to float rounding; the learner checks that at set-up (``check_packing``).

It is an attention implementation registered with transformers' ``AttentionInterface`` as
``grpo_group_<original>``: called without a layout (the padded layout, the set-up probe) it is
the model's original implementation, unchanged. Softmax attention, with the module's sliding window
if it has one (``sliding_window``: a key is seen while query position - key position < window, as
transformers' masks do); a module with logit soft-capping or attention sinks raises, and the
check falls back.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch
import torch.nn.functional as F

PREFIX = "grpo_group_"
KWARG = "grpo_groups"  # the model-call keyword that carries the layout down to the attention


@dataclass
class GroupLayout:
    """Where the blocks of one packed micro-batch lie in its flattened ``[R * L]`` positions."""

    comp_q: torch.Tensor  # [B, C] long: each completion's token positions (0 past its end)
    comp_k: torch.Tensor  # [B, P + C] long: its prompt's positions (0 past the prompt), then comp_q
    comp_mask: torch.Tensor  # [B, 1, C, P + C] bool: which of those keys each token attends to
    comp_pos: torch.Tensor  # [B, P + C] long: the position id of each of those keys (the queries': [:, P:])
    comp_src: torch.Tensor  # [Nc] long: the real tokens among the B * C block positions
    comp_dst: torch.Tensor  # [Nc] long: their flat positions
    prompt_q: torch.Tensor  # [S, P] long: each prompt's positions (one per packed group segment)
    prompt_mask: torch.Tensor  # [S, 1, P, P] bool: causal over the prompt's real tokens
    prompt_pos: torch.Tensor  # [S, P] long: position ids (0..P-1)
    prompt_src: torch.Tensor  # [Np] long
    prompt_dst: torch.Tensor  # [Np] long

    def to(self, device) -> "GroupLayout":
        return GroupLayout(**{f.name: getattr(self, f.name).to(device) for f in fields(self)})


def build_layout(segments: list[tuple[int, list[tuple[int, int]]]], prompt_lens: list[int]) -> GroupLayout:
    """``segments[s] = (prompt start, [(completion start, length), ...])`` in flat positions, with
    ``prompt_lens[s]`` tokens of prompt; completions numbered in segment order (batch order)."""
    comps = [(s, start, m) for s, (_, cs) in enumerate(segments) for start, m in cs]
    B, S = len(comps), len(segments)
    P, C = max(1, max(prompt_lens)), max([1] + [m for _, _, m in comps])
    ar_p, ar_c = torch.arange(P), torch.arange(C)

    p_start = torch.tensor([p for p, _ in segments], dtype=torch.long)
    p_len = torch.tensor(prompt_lens, dtype=torch.long)
    p_real = ar_p[None, :] < p_len[:, None]  # [S, P]
    prompt_q = torch.where(p_real, p_start[:, None] + ar_p[None, :], torch.zeros((), dtype=torch.long))
    causal_p = ar_p[None, :] <= ar_p[:, None]  # [P(query), P(key)]
    prompt_mask = (causal_p[None] & p_real[:, None, :])[:, None]  # padded queries still see key 0

    seg = torch.tensor([s for s, _, _ in comps], dtype=torch.long)
    c_start = torch.tensor([st for _, st, _ in comps], dtype=torch.long)
    c_len = torch.tensor([m for _, _, m in comps], dtype=torch.long)
    c_real = ar_c[None, :] < c_len[:, None]  # [B, C]
    comp_q = torch.where(c_real, c_start[:, None] + ar_c[None, :], torch.zeros((), dtype=torch.long))
    comp_k = torch.cat([prompt_q[seg], comp_q], dim=1)
    causal_c = ar_c[None, :] <= ar_c[:, None]  # [C, C]
    own = causal_c[None] & c_real[:, None, :]  # [B, C, C]
    sees_prompt = p_real[seg][:, None, :].expand(B, C, P)
    comp_mask = torch.cat([sees_prompt, own], dim=2)[:, None]
    comp_pos = torch.cat([ar_p.expand(B, P), p_len[seg][:, None] + ar_c[None, :]], dim=1)

    return GroupLayout(comp_q=comp_q, comp_k=comp_k, comp_mask=comp_mask, comp_pos=comp_pos,
                       comp_src=c_real.flatten().nonzero().flatten(), comp_dst=comp_q[c_real],
                       prompt_q=prompt_q, prompt_mask=prompt_mask, prompt_pos=ar_p.expand(S, P).contiguous(),
                       prompt_src=p_real.flatten().nonzero().flatten(), prompt_dst=prompt_q[p_real])


def _unsupported(module) -> str | None:
    for attr in ("attn_logit_softcapping", "sinks"):
        if getattr(module, attr, None) is not None:
            return attr
    cfg = getattr(module, "config", None)
    if getattr(cfg, "attn_logit_softcapping", None) is not None:
        return "attn_logit_softcapping"
    return None


def group_attention(module, query, key, value, layout: GroupLayout, dropout: float = 0.0, scaling=None,
                    sliding_window=None, **kwargs):
    """``query [R, H, L, D]``, ``key/value [R, Hkv, L, D]`` -> ``[R, L, H, D]`` (0 at padding).
    ``sliding_window`` (or the module's attribute): a key is seen while query - key position < it;
    ``kwargs``: what the model passed its attention function besides (soft-capping, sinks: refused)."""
    bad = _unsupported(module) or next((k for k in ("softcap", "s_aux") if kwargs.get(k) is not None), None)
    if bad is not None:
        raise NotImplementedError(f"group attention covers softmax attention with an optional sliding window "
                                  f"only (the module has {bad})")
    window = sliding_window if sliding_window is not None else getattr(module, "sliding_window", None)
    R, H, L, D = query.shape
    Hkv = key.shape[1]  # grouped-query attention: query head h reads key/value head h // (H / Hkv)
    q = query.transpose(0, 1).reshape(H, R * L, D)
    k, v = (t.transpose(0, 1).reshape(Hkv, R * L, t.shape[-1]) for t in (key, value))
    scale = scaling if scaling is not None else D ** -0.5

    def block(qi, ki, mask, src):
        # index_select, not t[:, idx]: its backward is an index_add, cheaper on CPU than index_put
        sel = [t.index_select(1, i.flatten()).view(t.shape[0], *i.shape, t.shape[-1]).transpose(0, 1)
               for t, i in ((q, qi), (k, ki), (v, ki))]  # [n, heads, len, D]
        out = _attend(*sel, mask, dropout, scale)
        return out.transpose(0, 1).reshape(H, -1, out.shape[-1])[:, src]  # [H, real tokens, D]

    def windowed(mask, qpos, kpos):
        if not window:
            return mask
        mask = mask & ((qpos[:, :, None] - kpos[:, None, :]) < window)[:, None]
        # a padding query far past its prompt may now see no key: give it key 0 (its output is
        # dropped, but an all-masked softmax row would be NaN, and NaN * 0 poisons the gradients)
        empty = ~mask.any(-1, keepdim=True)
        first = torch.zeros_like(mask)
        first[..., 0] = True
        return mask | (empty & first)

    P = layout.prompt_q.shape[1]
    out = query.new_zeros(H, R * L, value.shape[-1])
    out = out.index_copy(1, layout.prompt_dst, block(
        layout.prompt_q, layout.prompt_q, windowed(layout.prompt_mask, layout.prompt_pos, layout.prompt_pos),
        layout.prompt_src))
    out = out.index_copy(1, layout.comp_dst, block(
        layout.comp_q, layout.comp_k, windowed(layout.comp_mask, layout.comp_pos[:, P:], layout.comp_pos),
        layout.comp_src))
    return out.view(H, R, L, -1).permute(1, 2, 0, 3).contiguous()


MATH_MAX_SCORES = 1 << 25  # fp32 scores (128 MiB) up to which CPU attention is done as plain matmuls


def _attend(q, k, v, mask, dropout: float, scale: float):
    """Softmax attention of short blocks: ``q [n, H, lq, D]``, ``k, v [n, Hkv, lk, D]``, ``mask
    [n, 1, lq, lk]`` -> ``[n, H, lq, D]``. On CPU, explicit matmuls with fp32 scores and softmax,
    the query heads of one key/value head stacked along the query axis (no copy of k and v per
    query head): torch's CPU flash kernel is slower forward + backward on blocks this short
    (benchmarks/NOTES.md)."""
    n, H, lq, D = q.shape
    Hkv, lk = k.shape[1], k.shape[2]
    if q.device.type != "cpu" or dropout > 0.0 or n * H * lq * lk > MATH_MAX_SCORES:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout, scale=scale,
                                              enable_gqa=Hkv != H)
    rep = H // Hkv
    scores = torch.matmul(q.reshape(n, Hkv, rep * lq, D).float(), k.float().transpose(-1, -2)) * scale
    scores = scores.view(n, Hkv, rep, lq, lk).masked_fill(~mask[:, :, None], float("-inf"))
    probs = scores.softmax(-1).view(n, Hkv, rep * lq, lk)
    return torch.matmul(probs.to(v.dtype), v).view(n, H, lq, v.shape[-1])


def _make_interface(original: str):
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    def attention(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None, **kwargs):
        layout = kwargs.pop(KWARG, None)
        if layout is None:  # not a packed micro-batch: the model's own attention, as it was
            fn = ALL_ATTENTION_FUNCTIONS[original] if original != "eager" else _eager(module)
            return fn(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs)
        return group_attention(module, query, key, value, layout, dropout, scaling, **kwargs), None

    return attention


def _eager(module):
    import importlib

    return importlib.import_module(type(module).__module__).eager_attention_forward


def enable(model) -> str:
    """Switch ``model`` (a transformers model, or a PEFT model around one) to group attention;
    returns the implementation it had. Calls without the layout keyword behave as before."""
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS, AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    config = model.config
    original = config._attn_implementation or "eager"
    if original.startswith(PREFIX):
        return original[len(PREFIX):]
    if original != "eager" and original not in ALL_ATTENTION_FUNCTIONS:
        raise NotImplementedError(f"attention implementation {original!r} is not a registered function")
    name = PREFIX + original
    AttentionInterface.register(name, _make_interface(original))
    if original in ALL_MASK_ATTENTION_FUNCTIONS:  # the padded layout's masks, made as for the original
        AttentionMaskInterface.register(name, ALL_MASK_ATTENTION_FUNCTIONS[original])
    config._attn_implementation = name
    return original


def disable(model, original: str) -> None:
    model.config._attn_implementation = original
