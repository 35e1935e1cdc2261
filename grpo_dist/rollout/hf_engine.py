"""transformers backend (``rollout.backend: hf``): same interface as vLLM, for machines without it.

Slow (no paged attention, no continuous batching) but exact: behaviour log-probs are the
log-softmax of the processed scores (temperature, top-k, top-p applied), like vLLM's
``processed_logprobs``.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from grpo_dist.rollout.base import Generator, Sample, SamplingSpec

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class HFGenerator(Generator):
    def __init__(self, model_path: str, *, dtype: str = "float32", seed: int = 0,
                 trust_remote_code: bool = False, **_ignored):
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

    @torch.no_grad()
    def generate(self, prompt_ids: list[list[int]], spec: SamplingSpec,
                 seeds: list[list[int]] | None = None) -> list[list[Sample]]:
        """One prompt at a time (no left-padding subtleties). With ``seeds``, one ``generate``
        call per sample under ``torch.manual_seed(seeds[i][j])`` (inside ``fork_rng``: the
        process's own stream is left alone), so a sample depends on its seed only; without,
        the engine's stream (seeded once at start) advances from call to call."""
        tok = self.tokenizer
        kw = dict(max_new_tokens=spec.max_tokens, pad_token_id=tok.pad_token_id if tok.pad_token_id is not None
                  else tok.eos_token_id, eos_token_id=tok.eos_token_id, output_scores=True,
                  return_dict_in_generate=True)
        if spec.greedy:
            kw.update(do_sample=False)
        else:
            kw.update(do_sample=True, temperature=spec.temperature, top_p=spec.top_p,
                      top_k=spec.top_k if spec.top_k > 0 else 0)
        if spec.stop:
            kw.update(stop_strings=list(spec.stop), tokenizer=tok)
        out: list[list[Sample]] = []
        for i, ids in enumerate(prompt_ids):
            if seeds is not None and not spec.greedy:
                samples = []
                for s in seeds[i]:
                    with torch.random.fork_rng(devices=[]):
                        torch.manual_seed(s)
                        samples += self._sample(ids, 1, spec, kw)
            else:
                torch.manual_seed(int(torch.randint(0, 2**31 - 1, (1,), generator=self._rng)))
                samples = self._sample(ids, spec.n, spec, kw)
            out.append(samples)
        return out

    def _sample(self, ids: list[int], n: int, spec: SamplingSpec, kw: dict) -> list[Sample]:
        tok, eos = self.tokenizer, self.tokenizer.eos_token_id
        inp = torch.tensor([ids], device=self.device)
        res = self.model.generate(inp, attention_mask=torch.ones_like(inp), num_return_sequences=n, **kw)
        new = res.sequences[:, inp.shape[1]:]
        scores = torch.stack(res.scores, dim=1).float()  # [n, steps, V] processed logits
        logps = torch.log_softmax(scores, dim=-1).gather(-1, new[:, : scores.shape[1], None]).squeeze(-1)
        samples = []
        for i in range(new.shape[0]):
            seq = new[i].tolist()
            stop = len(seq)
            for j, t in enumerate(seq):
                if t == eos:
                    stop = j + 1
                    break
            toks = seq[:stop]
            text = tok.decode(toks, skip_special_tokens=True)
            finished = (stop < len(seq)) or (toks and toks[-1] == eos)
            hit_stop = any(s in text for s in spec.stop)
            samples.append(Sample(token_ids=toks, text=text, logprobs=logps[i, :stop].tolist(),
                                  finish_reason="stop" if finished or hit_stop or len(toks) < spec.max_tokens
                                  else "length"))
        return samples

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
