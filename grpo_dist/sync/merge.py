"""Serving a LoRA version as merged weights (``rollout.adapter_mode: merged``).

vLLM's CPU build runs LoRA layers through slow generic kernels: generation with an adapter takes
several times as long as from merged weights (benchmarks/NOTES.md). So
on CPU engines the rollout worker keeps receiving the small adapter (the transport is unchanged)
and merges it itself, W' = W + scaling * B @ A, into a copy of the base weights, which the engine
then reloads in place (``reload_weights``).

Only the layers an adapter touches are reloaded, each one whole: vLLM stacks q, k and v (and
gate, up) into one parameter, and its layerwise reload leaves the unloaded slices of a partly
loaded layer uninitialised, so a merged q_proj travels with its layer's k_proj and v_proj.
Projections outside that known Llama-family naming (e.g. GPT-2's c_attn) reload the whole state.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Iterator

import torch

_PEFT_PREFIX = "base_model.model."
# vLLM's packed_modules_mapping for the Llama family (Llama, Qwen2, Mistral, ...): HF projections
# it stacks into one parameter; and the projections it keeps as they are
_PACKED = ({"q_proj", "k_proj", "v_proj"}, {"gate_proj", "up_proj"})
_KNOWN = set().union(*_PACKED) | {"o_proj", "down_proj"}


class MergeError(ValueError):
    pass


def lora_scaling(peft_config: dict[str, Any]) -> float:
    r, alpha = int(peft_config["r"]), float(peft_config["lora_alpha"])
    return alpha / math.sqrt(r) if peft_config.get("use_rslora") else alpha / r


def lora_factors(tensors: dict[str, torch.Tensor],
                 peft_config: dict[str, Any]) -> dict[str, tuple[torch.Tensor, torch.Tensor, float, bool]]:
    """``{base weight name: (B, A, scaling, fan_in_fan_out)}`` for a PEFT LoRA state dict
    (``get_peft_model_state_dict`` names: ``base_model.model.<module>.lora_A.weight``): the delta
    of that weight is ``scaling * B @ A`` (transposed with ``fan_in_fan_out``)."""
    for key in ("use_dora", "rank_pattern", "alpha_pattern"):
        if peft_config.get(key):
            raise MergeError(f"adapter uses {key}: serve it with rollout.adapter_mode: lora")
    scaling = lora_scaling(peft_config)
    fan_in_fan_out = bool(peft_config.get("fan_in_fan_out"))
    factors = {}
    for name, a in tensors.items():
        if ".lora_A." not in name:
            if ".lora_B." not in name:
                raise MergeError(f"not a LoRA weight: {name} (only lora_A/lora_B tensors can be merged)")
            continue
        b = tensors.get(name.replace(".lora_A.", ".lora_B."))
        if b is None:
            raise MergeError(f"{name} has no lora_B partner")
        module = name.split(".lora_A.")[0]
        base = (module[len(_PEFT_PREFIX):] if module.startswith(_PEFT_PREFIX) else module) + ".weight"
        factors[base] = (b, a, scaling, fan_in_fan_out)
    return factors


def _merge_one(w: torch.Tensor, b: torch.Tensor, a: torch.Tensor, scaling: float, fan_in_fan_out: bool,
               dtype: torch.dtype) -> torch.Tensor:
    """``W + scaling * B @ A`` in float32 (one fused addmm), then in ``dtype``. One output tensor
    and one pass instead of a dense delta, a sum and casts (faster: benchmarks/NOTES.md)."""
    b, a = b.float(), a.float()
    if fan_in_fan_out:  # W is [in, out]: add (B @ A)^T = A^T @ B^T
        b, a = a.T, b.T
    return torch.addmm(w.float(), b, a, alpha=scaling).to(dtype)


def merge_weight(w: torch.Tensor, factor: tuple[torch.Tensor, torch.Tensor, float, bool],
                 dtype: torch.dtype | None = None) -> torch.Tensor:
    """One weight with its :func:`lora_factors` entry merged in, in ``dtype`` (default ``w``'s): for
    a merge outside :class:`LoraMerger` (``grpo-dist export``, a shard at a time)."""
    b, a, scaling, fan_in_fan_out = factor
    shape = (a.shape[1], b.shape[0]) if fan_in_fan_out else (b.shape[0], a.shape[1])
    if tuple(w.shape) != shape:
        raise MergeError(f"adapter delta {shape} vs base {tuple(w.shape)}")
    return _merge_one(w, b, a, scaling, fan_in_fan_out, dtype or w.dtype)


def load_state(model_dir: str | Path) -> dict[str, torch.Tensor]:
    """Every tensor of a local HF checkpoint directory (``*.safetensors``)."""
    from safetensors.torch import load_file

    files = sorted(Path(model_dir).glob("*.safetensors"))
    if not files:
        raise MergeError(f"{model_dir}: no *.safetensors files to merge an adapter into "
                         "(rollout.adapter_mode: merged needs the base weights as safetensors)")
    state: dict[str, torch.Tensor] = {}
    for f in files:
        state.update(load_file(str(f)))
    return state


class LoraMerger:
    """The base weights of one model, kept in memory as stored, and the adapter versions merged
    into them. ``dtype``: the engine's weights dtype; what ``merged`` returns is cast to it after
    the merge (``bf16(W + delta)``, merged at the stored precision), so a bfloat16 engine reloads
    half the bytes and vLLM converts nothing (it warned once per weight on every reload).

    :meth:`shared` gives one merger per model directory and dtype in a process: an engine core in
    the rollout actor's process and the actor itself then hold one copy of the base, not two."""

    _shared: dict[tuple[str, Any], "LoraMerger"] = {}

    def __init__(self, model_dir: str | Path, dtype: torch.dtype | None = None):
        self.base = load_state(model_dir)
        self.dtype = dtype

    @classmethod
    def shared(cls, model_dir: str | Path, dtype: torch.dtype | None = None) -> "LoraMerger":
        key = (str(Path(model_dir).resolve()), dtype)
        if key not in cls._shared:
            cls._shared[key] = cls(model_dir, dtype)
        return cls._shared[key]

    def merged(self, tensors: dict[str, torch.Tensor] | None, peft_config: dict[str, Any] | None,
               partial: bool = False) -> dict[str, torch.Tensor]:
        """The state with the adapter merged in (``tensors`` None: the base itself). ``partial``:
        only the layers the adapter changes, each completed with the projections vLLM stacks
        with it (the whole state where a target is not a known Llama-family projection)."""
        return dict(self.iter_merged(tensors, peft_config, partial))

    def iter_merged(self, tensors: dict[str, torch.Tensor] | None, peft_config: dict[str, Any] | None,
                    partial: bool = False) -> Iterator[tuple[str, torch.Tensor]]:
        """:meth:`merged` one tensor at a time, in the base's order, each merged (or cast) only
        when it is asked for: a consumer that loads as it goes (vLLM's layerwise reload) holds
        one merged weight at a time, not the whole state. The adapter is checked here, before
        the first tensor."""
        if tensors is None:
            return self._cast_each(self.base, None)
        factors = lora_factors(tensors, peft_config or {})
        for name, (b, a, _, fan_in_fan_out) in factors.items():
            w = self.base.get(name)
            if w is None:
                raise MergeError(f"adapter weight for {name}, which the base model does not have")
            shape = (a.shape[1], b.shape[0]) if fan_in_fan_out else (b.shape[0], a.shape[1])
            if tuple(w.shape) != shape:
                raise MergeError(f"{name}: adapter delta {shape} vs base {tuple(w.shape)}")
        modules = self._stacked_modules(factors) if partial else None
        keep = None if modules is None else [k for k in self.base if k in factors or k[:k.rfind(".") + 1] in modules]
        return self._cast_each(self.base if keep is None else keep, factors)

    @staticmethod
    def _stacked_modules(factors) -> set[str] | None:
        """The module prefixes (``...self_attn.q_proj.``) of every layer the adapter touches, with
        the projections vLLM stacks with each; None where a target is not a known projection
        (the whole state is reloaded)."""
        modules = set()
        for name in factors:
            parent, short, _ = name.rsplit(".", 2)
            if short not in _KNOWN:
                return None
            group = next((g for g in _PACKED if short in g), {short})
            modules |= {f"{parent}.{m}." for m in group}
        return modules

    def _cast_each(self, names, factors) -> Iterator[tuple[str, torch.Tensor]]:
        for name in names:
            w = self.base[name]
            if factors is not None and name in factors:
                b, a, scaling, fan_in_fan_out = factors[name]
                yield name, _merge_one(w, b, a, scaling, fan_in_fan_out, self.dtype or w.dtype)
            elif self.dtype is not None and w.is_floating_point():
                yield name, w.to(self.dtype)
            else:
                yield name, w


def read_adapter_dir(path: str | Path) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """A PEFT adapter directory's tensors and config."""
    from safetensors.torch import load_file

    path = Path(path)
    return load_file(str(path / "adapter_model.safetensors")), json.loads((path / "adapter_config.json").read_text())
