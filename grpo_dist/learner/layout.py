"""The layout micro-batches take on the way into the model: padded, or packed (``packing.py``),
and the group-attention wrapper the ``group`` layout needs on the model.

A ``Layout`` owns that state -- the mode, the ``mask`` layout's row length, the attention
implementation it wrapped and on which models -- and ``Layout.choose`` decides it once at set-up
by checking each candidate against the padded layout on the learner's own model.
"""

from __future__ import annotations

from typing import Callable, Optional

import torch

from grpo_dist.types import TrainBatch

from . import group_attention
from .batching import Collated, collate
from .packing import collate_packed
from .state import all_reduce_floats

MODES = ("group", "mask", "off")


class Layout:
    """``mode``: ``"group"`` (one row per micro-batch, group attention), ``"mask"`` (a row per
    prompt group of at most ``pack_len`` tokens, 4-D mask) or ``"off"`` (padded); ``line``: the
    set-up line saying which and why."""

    def __init__(self, pad_id: int, device: torch.device, mask_dtype: torch.dtype,
                 models: Callable[[], list[torch.nn.Module]]):
        """``models``: the modules group attention must switch (the policy, and a full-weight
        reference copy: it reads packed rows too)."""
        self.pad_id, self.device, self.mask_dtype = pad_id, device, mask_dtype
        self._models = models
        self.mode, self.pack_len = "off", 0
        self.line = ""
        self._attn_original: Optional[str] = None  # the implementation group attention wraps, while on

    def collate(self, batch: TrainBatch, rows: Optional[range] = None, mode: Optional[str] = None,
                pack_len: Optional[int] = None, device: Optional[torch.device] = None) -> Collated:
        """Rows ``rows`` (default all) of ``batch`` on ``device`` (default: the learner's), in
        ``mode`` (default: the chosen layout) with ``mask`` rows of at most ``pack_len`` tokens
        (default: the chosen)."""
        mode = self.mode if mode is None else mode
        device = self.device if device is None else device
        if mode not in MODES:
            raise ValueError(f"unknown layout {mode!r}; expected one of {MODES}")
        if mode == "off":
            return collate(batch, rows, self.pad_id).to(device)
        length = pack_len or self.pack_len or 1
        return collate_packed(batch, rows, self.pad_id, length, self.mask_dtype, group=mode == "group").to(device)

    # ------------------------------------------------------------------ group attention
    def group_attention(self, on: bool) -> None:
        """Switch the models to group attention, or back."""
        models = self._models()
        if on:
            self._attn_original = [group_attention.enable(m) for m in models][0]
        elif self._attn_original is not None:
            for m in models:
                group_attention.disable(m, self._attn_original)
            self._attn_original = None

    # ------------------------------------------------------------------ the set-up check
    def choose(self, packing: str, pack_max_len: Optional[int], model_config,
               logprobs: Callable[[Collated], torch.Tensor], world_size: int) -> str:
        """Decide ``mode`` / ``pack_len`` for ``learner.packing`` = ``packing`` and set ``line``.

        Each candidate (``auto``: group, then mask) must give this model's padded log-probs on a
        probe batch (2 prompts x 3 completions of random tokens, padded log-probs taken with the
        model's own attention first): it is kept if its difference from them is within 1e-3 or a
        tenth of a wrong layout's (the same rows with a plain causal mask: completions see each
        other), and for ``group``, if the padded layout through the group-attention wrapper is
        unchanged. ``logprobs``: the policy's no-grad log-probs of a micro-batch. Every rank
        decides alike. A rejected candidate is undone; if none passes, the layout is padded."""
        self.mode, self.pack_len = "off", 0
        if packing == "off":
            self.line = "learner: packing off (learner.packing: off)"
            return self.mode
        length = int(pack_max_len or getattr(model_config, "hidden_size", 0) or 512)
        probe = _probe_batch(int(getattr(model_config, "vocab_size", 0) or 32))
        padded = logprobs(self.collate(probe, mode="off"))
        original = getattr(model_config, "_attn_implementation", "?")
        reasons = []
        for mode in (["group", "mask"] if packing == "auto" else [packing]):
            error = ""
            try:
                if mode == "group":
                    self.group_attention(True)
                    again = logprobs(self.collate(probe, mode="off"))
                    if float((again - padded).abs().max()) > 1e-5:
                        raise RuntimeError("the padded layout changed under the group-attention wrapper")
                mb = self.collate(probe, mode=mode, pack_len=length)
                packed = logprobs(mb)
                wrong = logprobs(self._causal_rows(mb))
                d, d_wrong = float((packed - padded).abs().max()), float((wrong - padded).abs().max())
            except Exception as e:  # an attention implementation that refuses 4-D masks, position ids, ...
                d, d_wrong, error = float("inf"), 0.0, f"{type(e).__name__}: {e}"
            ok = d <= max(1e-3, 0.1 * d_wrong)
            if world_size > 1:
                ok = all_reduce_floats([0.0 if ok else 1.0], "max")[0] == 0.0
            if ok:
                what = ("one row per micro-batch, group attention" if mode == "group"
                        else f"a row per prompt group of <= {length} tokens, 4-D mask")
                self.mode, self.pack_len = mode, (length if mode == "mask" else 0)
                self.line = (f"learner: group packing on ({what}; probe: max |logp packed - padded| {d:.1e}, "
                             f"wrong layout {d_wrong:.1e})")
                return self.mode
            if mode == "group":
                self.group_attention(False)
            reasons.append(f"{mode}: " + (error or f"max |logp packed - padded| {d:.1e} vs {d_wrong:.1e} with a "
                                                  "wrong layout"))
        self.line = (f"learner: group packing off: the model's attention ({original}) does not give the padded "
                     f"log-probs packed ({'; '.join(reasons)}); set learner.packing: off to skip this check")
        return self.mode

    def _causal_rows(self, mb: Collated) -> Collated:
        """``mb`` with the wrong layout: one plain causal mask over each row (completions see each other)."""
        R, L = mb.input_ids.shape
        neg = torch.finfo(self.mask_dtype).min
        mb.groups = None
        mb.attention_mask = torch.triu(torch.full((L, L), neg, dtype=self.mask_dtype), 1).expand(
            R, 1, L, L).contiguous().to(mb.input_ids.device)
        return mb


def _probe_batch(vocab: int) -> TrainBatch:
    g = torch.Generator().manual_seed(0)

    def toks(n: int) -> list[int]:
        return torch.randint(min(4, vocab - 1), vocab, (n,), generator=g).tolist()

    prompts = [toks(3), toks(5)]
    comps = [toks(n) for n in (4, 1, 6, 3, 5, 2)]
    return TrainBatch(prompt_ids=[prompts[i // 3] for i in range(6)], completion_ids=comps,
                      behaviour_logprobs=[], advantages=[0.0] * 6)
