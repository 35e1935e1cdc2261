"""transformers backend (``rollout.backend: hf``): same interface as vLLM, for machines without it.

One batched decode loop over all prompts x samples: left padding (attention mask, position ids
= cumsum(mask) - 1), the model's KV cache, each prompt prefilled once and its cache copied to
its n rows, finished rows dropped from the batch. No paged attention or continuous batching,
but exact: behaviour log-probs are the log-softmax of the processed scores (temperature, top-k,
top-p applied), like vLLM's ``processed_logprobs``.
"""

from __future__ import annotations

import inspect
import json
from pathlib import Path

import torch

from grpo_dist.rollout.base import Generator, Sample, SamplingSpec, progress_of

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class HFGenerator(Generator):
    def __init__(self, model_path: str, *, dtype: str = "float32", seed: int = 0,
                 trust_remote_code: bool = False, max_batch_size: int = 128, **_ignored):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(model_path, trust_remote_code=trust_remote_code)
        self.base = AutoModelForCausalLM.from_pretrained(
            model_path, dtype=_DTYPES[dtype], trust_remote_code=trust_remote_code).eval()
        self.model = self.base
        self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        self.base.to(self.device)
        self.seed = seed
        self._rng = torch.Generator(device="cpu").manual_seed(seed)  # unseeded calls: one advancing stream
        self._peft = None
        self.max_batch_size = max_batch_size  # rows (prompts x samples) decoded together
        tok = self.tokenizer
        self._pad_id = tok.pad_token_id if tok.pad_token_id is not None else (tok.eos_token_id or 0)
        gen_cfg = getattr(self.base, "generation_config", None)
        eos = getattr(gen_cfg, "eos_token_id", None)  # chat models: the end of turn as well
        self._eos_ids = {i for i in ([tok.eos_token_id] + (eos if isinstance(eos, list) else [eos]))
                         if i is not None}
        self._logits_to_keep = "logits_to_keep" in inspect.signature(self.base.forward).parameters
        progress_of(self).runs_on_caller = True  # a call computes on its caller's thread

    @torch.no_grad()
    def generate(self, prompt_ids: list[list[int]], spec: SamplingSpec,
                 seeds: list[list[int]] | None = None) -> list[list[Sample]]:
        """All prompts x ``spec.n`` samples in one batched, left-padded decode loop with a KV cache
        (chunks of at most ``max_batch_size`` rows, prompts sorted by length to limit padding).

        Sampling is by inverse CDF: row r takes the token at which the cumulative processed
        distribution first exceeds its uniform ``u[r, t]``. The uniforms of each row are drawn up
        front, before any batching: with ``seeds`` from a ``torch.Generator`` seeded with
        ``seeds[i][j]`` (so a sample depends on its seed only, not on the batch, the order or the
        other prompts), without from the engine's stream (seeded once at start, advancing from call
        to call). Greedy (temperature 0): argmax, the log-probs of the raw logits.
        """
        if seeds is not None and not spec.greedy:
            if len(seeds) != len(prompt_ids) or any(len(s) != spec.n for s in seeds):
                raise ValueError(f"seeds must be {len(prompt_ids)} lists of {spec.n} seeds")
        if not prompt_ids:
            return []
        n = 1 if spec.greedy else spec.n  # greedy samples of one prompt are all the same: decode one
        steps = spec.max_tokens
        if spec.greedy:
            u = None
        elif seeds is not None:
            u = torch.stack([torch.rand(steps, generator=torch.Generator(device="cpu").manual_seed(int(s)))
                             for row in seeds for s in row]).view(len(prompt_ids), n, steps)
        else:
            u = torch.rand(len(prompt_ids), n, steps, generator=self._rng)
        out: list[list[Sample] | None] = [None] * len(prompt_ids)
        order = sorted(range(len(prompt_ids)), key=lambda i: len(prompt_ids[i]))
        per_chunk = max(1, self.max_batch_size // n)
        for c in range(0, len(order), per_chunk):
            idx = order[c:c + per_chunk]
            rows = self._decode([prompt_ids[i] for i in idx], n, spec,
                                None if u is None else u[idx].reshape(len(idx) * n, steps))
            for k, i in enumerate(idx):
                out[i] = rows[k * n:(k + 1) * n]
        if spec.greedy and spec.n > 1:
            out = [[Sample(list(s.token_ids), s.text, list(s.logprobs), s.finish_reason)
                    for _ in range(spec.n) for s in g] for g in out]
        return out

    def _forward(self, ids: torch.Tensor, mask: torch.Tensor, pos: torch.Tensor, cache):
        kw = {"logits_to_keep": 1} if self._logits_to_keep else {}
        res = self.model(input_ids=ids, attention_mask=mask, position_ids=pos, past_key_values=cache,
                         use_cache=True, **kw)
        progress_of(self).tick()  # one decode step: the call moves
        return res.logits[:, -1].float(), res.past_key_values

    def _decode(self, prompts: list[list[int]], n: int, spec: SamplingSpec,
                u: torch.Tensor | None) -> list[Sample]:
        """``n`` samples of each prompt, rows prompt-major; ``u`` [rows, max_tokens] uniforms."""
        dev, tok = self.device, self.tokenizer
        P, L = len(prompts), max(len(p) for p in prompts)
        ids = torch.full((P, L), self._pad_id, dtype=torch.long)
        mask = torch.zeros((P, L), dtype=torch.long)
        for k, p in enumerate(prompts):  # left padding
            ids[k, L - len(p):] = torch.tensor(p, dtype=torch.long)
            mask[k, L - len(p):] = 1
        ids, mask = ids.to(dev), mask.to(dev)
        pos = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 1)
        rep = torch.arange(P, device=dev).repeat_interleave(n)
        # prefill each prompt once, then give each of its n rows a copy of its cache
        logits, cache = self._forward(ids, mask, pos, None)
        if n > 1:
            if _can_select(cache):
                cache.batch_select_indices(rep)
                logits = logits[rep]
            else:
                logits, cache = self._forward(ids[rep], mask[rep], pos[rep], None)
        mask = mask[rep]
        next_pos = mask.sum(-1, keepdim=True)  # position of the next token: number of real tokens
        compact = _can_select(cache)
        if u is not None:
            u = u.to(dev)
        R = P * n
        toks: list[list[int]] = [[] for _ in range(R)]
        lps: list[list[float]] = [[] for _ in range(R)]
        reasons = ["length"] * R
        act = list(range(R))  # rows of the batch tensors (all rows, or the unfinished ones if compact)
        live = [True] * R
        stop_window = max((len(s.encode()) for s in spec.stop), default=0) + 8  # tokens that can hold a stop string
        for t in range(spec.max_tokens):
            x = _process(logits, spec)
            if u is None:
                nxt = x.argmax(-1)
            else:
                cdf = torch.softmax(x, -1).cumsum(-1)
                target = (u[act, t] * cdf[:, -1]).unsqueeze(-1)
                nxt = torch.searchsorted(cdf, target, right=True).squeeze(-1).clamp_(max=x.shape[-1] - 1)
            lp = torch.log_softmax(x, -1).gather(-1, nxt[:, None]).squeeze(-1)
            for r, tk, l in zip(act, nxt.tolist(), lp.tolist()):
                if not live[r]:
                    continue
                toks[r].append(tk)
                lps[r].append(l)
                if tk in self._eos_ids:
                    live[r], reasons[r] = False, "stop"
                elif spec.stop and any(s in tok.decode(toks[r][-stop_window:], skip_special_tokens=True)
                                       for s in spec.stop):
                    live[r], reasons[r] = False, "stop"
            if t == spec.max_tokens - 1 or not any(live):
                break
            feed = nxt
            if compact and not all(live[r] for r in act):
                keep = [k for k, r in enumerate(act) if live[r]]
                sel = torch.tensor(keep, device=dev)
                cache.batch_select_indices(sel)
                act, feed, mask, next_pos = [act[k] for k in keep], nxt[sel], mask[sel], next_pos[sel]
            mask = torch.cat([mask, mask.new_ones((mask.shape[0], 1))], dim=1)
            logits, cache = self._forward(feed[:, None], mask, next_pos, cache)
            next_pos = next_pos + 1
        return [Sample(token_ids=toks[r], text=tok.decode(toks[r], skip_special_tokens=True), logprobs=lps[r],
                       finish_reason=reasons[r]) for r in range(R)]

    def set_adapter(self, version: int, path: str | None) -> None:
        from peft import LoraConfig, get_peft_model, set_peft_model_state_dict
        from safetensors.torch import load_file

        if path is None:
            self.model = self.base if self._peft is None else self._peft
            if self._peft is not None:
                self._peft.base_model.disable_adapter_layers()
            return
        cfg = json.loads((Path(path) / "adapter_config.json").read_text())
        if self._peft is None:
            keep = {k: v for k, v in cfg.items() if k in LoraConfig.__dataclass_fields__}
            self._peft = get_peft_model(self.base, LoraConfig(**keep)).eval()
        self._peft.base_model.enable_adapter_layers()
        set_peft_model_state_dict(self._peft, load_file(str(Path(path) / "adapter_model.safetensors")))
        self.model = self._peft

    def load_full_weights(self, path: str) -> None:
        from safetensors.torch import load_file

        state = {}
        for f in sorted(Path(path).glob("*.safetensors")):
            state.update(load_file(str(f)))
        missing, unexpected = self.base.load_state_dict(state, strict=False)
        if unexpected:
            raise RuntimeError(f"unexpected weights in full update: {unexpected[:5]}")


def _process(logits: torch.Tensor, spec: SamplingSpec) -> torch.Tensor:
    """[B, V] float32 logits -> the processed scores, as transformers' warpers: temperature, then
    top-k, then top-p (removed tokens at -inf, at least one kept). Greedy: unchanged."""
    if spec.greedy:
        return logits
    x = logits / spec.temperature if spec.temperature != 1.0 else logits
    if 0 < spec.top_k < x.shape[-1]:
        kth = torch.topk(x, spec.top_k, dim=-1).values[:, -1:]
        x = x.masked_fill(x < kth, float("-inf"))
    if spec.top_p < 1.0:
        sorted_x, sorted_idx = torch.sort(x, dim=-1)
        drop = sorted_x.softmax(-1).cumsum(-1) <= 1 - spec.top_p
        drop[:, -1] = False
        x = x.masked_fill(drop.scatter(1, sorted_idx, drop), float("-inf"))
    return x


def _can_select(cache) -> bool:
    """Whether rows of this KV cache can be selected/copied (plain attention layers): not for
    linear-attention (recurrent-state) layers, whose states ``batch_select_indices`` leaves alone."""
    layers = getattr(cache, "layers", None)
    if not layers or not hasattr(cache, "batch_select_indices"):
        return False
    try:
        from transformers.cache_utils import DynamicLayer, LinearAttentionCacheLayerMixin
    except ImportError:  # pragma: no cover - other transformers versions
        return False
    return all(isinstance(l, DynamicLayer) and not isinstance(l, LinearAttentionCacheLayerMixin) for l in layers)
