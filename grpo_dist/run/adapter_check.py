"""An adapter against the base model it is about to be applied to, before any engine starts.

``grpo-dist eval --adapter DIR`` on another base than the adapter's ends, unchecked, minutes later
in a vLLM traceback about a shape. Here the adapter's LoRA tensors (``adapter_model.safetensors``)
and the model's weights (``*.safetensors`` in ``model.path``) are compared by their headers only
(no torch, no weights read): every adapted module must exist in the model, and its weight must be
``lora_B rows x lora_A columns`` (transposed for ``fan_in_fan_out`` layers, GPT-2's Conv1D).
"""

from __future__ import annotations

import json
from pathlib import Path

from grpo_dist.config import ConfigError
from grpo_dist.util.safetensors_header import WeightsError, shapes

PEFT_PREFIX = "base_model.model."


def _lora_modules(tensors: dict[str, list[int]]) -> dict[str, tuple[list[int], list[int]]]:
    """Module path -> (lora_A shape, lora_B shape) from PEFT's saved names."""
    out: dict[str, dict[str, list[int]]] = {}
    for name, shape in tensors.items():
        for part in ("lora_A", "lora_B"):
            tail = f".{part}.weight"
            if name.endswith(tail):
                module = name[: -len(tail)].removeprefix(PEFT_PREFIX)
                out.setdefault(module, {})[part] = shape
    return {m: (ab["lora_A"], ab["lora_B"]) for m, ab in out.items() if len(ab) == 2}


def _base_weight(module: str, weights: dict[str, list[int]]) -> list[int] | None:
    """The model's weight for ``module`` (saved with or without the task head's ``model.``
    prefix; a tied ``lm_head`` is the embedding)."""
    tail = module.split(".", 1)[1] if "." in module else module
    for cand in (module, tail, f"model.{module}"):
        if f"{cand}.weight" in weights:
            return weights[f"{cand}.weight"]
    if module.endswith("lm_head"):
        return next((s for n, s in weights.items() if n.endswith("embed_tokens.weight")), None)
    return None


def _x(shape: list[int]) -> str:
    return "x".join(str(n) for n in shape)


def check_adapter(adapter: str, model_path: str) -> None:
    """ConfigError (``--adapter: ...``, one line) when the adapter at ``adapter`` was trained on a
    model whose modules or shapes differ from ``model_path``'s. Silent where there is nothing to
    compare (weights not in safetensors, a quantized model)."""
    from grpo_dist.hub import local_model_dir

    a, model = Path(adapter), local_model_dir(model_path)
    conf = json.loads((a / "adapter_config.json").read_text())
    tensors_file = a / "adapter_model.safetensors"
    mcfg_file = model / "config.json"
    mcfg = json.loads(mcfg_file.read_text()) if mcfg_file.is_file() else {}
    files = sorted(model.glob("*.safetensors"))
    if not tensors_file.is_file() or not files or mcfg.get("quantization_config"):
        return
    try:
        lora = _lora_modules(shapes(tensors_file))
        weights = {k: v for f in files for k, v in shapes(f).items()}
    except WeightsError as e:
        raise ConfigError(f"--adapter: {e}") from None
    base = conf.get("base_model_name_or_path")
    trained_on = f"was trained on {base}" if base else "was trained on another model"
    hint = f"; evaluate it with --model.path {base}" if base and Path(base) != Path(model_path) else ""
    missing = sorted((m for m in lora if _base_weight(m, weights) is None), key=_layer_order)
    if missing:
        layers = sorted({n.rsplit(".", 2)[-2] for n, s in weights.items() if len(s) == 2 and "embed" not in n})
        said = [f"and {len(missing) - 1} more"] if len(missing) > 1 else []
        said += [f"adapter target_modules [{', '.join(sorted(conf.get('target_modules') or []))}]",
                 f"the model's: {', '.join(layers)}"]
        raise ConfigError(f"--adapter: {adapter} {trained_on}, whose modules model.path {model_path} does not have: "
                          f"{missing[0]} ({'; '.join(said)}){hint}")
    transposed = bool(conf.get("fan_in_fan_out"))
    wrong = []
    for m, (la, lb) in sorted(lora.items(), key=lambda kv: _layer_order(kv[0])):
        want = [lb[0], la[1]] if len(la) == 2 and len(lb) == 2 else None
        have = _base_weight(m, weights)
        if want is not None and have is not None and len(have) == 2:
            have_oi = have[::-1] if transposed else have
            if have_oi != want:
                wrong.append((m, la, lb, want, have_oi))
    if wrong:
        m, la, lb, want, have = wrong[0]
        hidden = f" (hidden_size {mcfg['hidden_size']})" if isinstance(mcfg.get("hidden_size"), int) else ""
        raise ConfigError(f"--adapter: {adapter} {trained_on} ({m}: lora_A {_x(la)}, lora_B {_x(lb)}, for a "
                          f"{_x(want)} weight) but model.path {model_path} has {_x(have)} there{hidden}; "
                          f"{len(wrong)} of {len(lora)} adapted modules differ{hint}")


def _layer_order(module: str) -> tuple[list[int], str]:
    """Sort key: by the numbers in the path (layers.10 after layers.9), then by name."""
    return [int(p) for p in module.split(".") if p.isdigit()], module
