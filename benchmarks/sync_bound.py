"""The weight-sync benchmark's yardsticks: the models it moves and the machine's copy bandwidth.

Models (random weights, timing only; the project's character tokenizer, the model's own vocabulary):

* ``tiny``, ``small``: the project's generated Llamas (``grpo_dist.models.SIZES``);
* ``smollm2``: SmolLM2-135M's shape (Llama, hidden 576, 30 layers, 9 heads / 3 KV heads,
  vocabulary 49152, tied embeddings);
* ``qwen05``: Qwen2-0.5B's shape (Qwen2, hidden 896, 24 layers, 14 heads / 2 KV heads, vocabulary
  151936, tied embeddings, q/k/v biases).

:func:`copy_bandwidth`: ``torch`` ``copy_`` of a 1 GiB float32 tensor into another, best of 5,
in bytes copied per second (each byte is read once and written once); on a GPU also host to
device (pinned) and device to device.
"""

from __future__ import annotations

import functools
import os
import time

SHAPES = {
    "smollm2": ("llama", dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
                              num_key_value_heads=3, vocab_size=49152, tie_word_embeddings=True, rope_theta=100000.0)),
    "qwen05": ("qwen2", dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                             num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True,
                             rope_theta=1000000.0)),
}
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def model_dir(model: str, cache) -> tuple[str, dict | None]:
    """(directory, ``model.make_if_missing``) of a benchmark model; a shaped one is written once."""
    if model in ("tiny", "small"):
        return str(cache / "bench_models" / f"{model}-untrained"), {"size": model, "pretrain_task": None}
    if model not in SHAPES:
        raise ValueError(f"unknown model {model!r}; expected tiny, small or one of {sorted(SHAPES)}")
    out = cache / "bench_models" / f"{model}-random"
    if not (out / "config.json").exists():
        _write_shaped(model, str(out))
    return str(out), None


def _write_shaped(model: str, out: str) -> None:
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config

    from grpo_dist.models import build_tokenizer

    arch, dims = SHAPES[model]
    tok = build_tokenizer()
    cls = LlamaConfig if arch == "llama" else Qwen2Config
    config = cls(max_position_embeddings=256, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                 pad_token_id=tok.pad_token_id, torch_dtype="float32", **dims)
    torch.manual_seed(0)
    m = AutoModelForCausalLM.from_config(config).float()
    tmp = out + ".partial"
    m.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    os.rename(tmp, out)


def loaded_bytes(path: str, lora: bool, itemsize: int = 4) -> int:
    """Bytes of weights (``itemsize`` each: float32) an engine loads per sync: all of them (full
    weights), or the weights of the LoRA target projections (merged serving reloads those)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    with torch.device("meta"):
        m = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(path))
    named = dict(m.named_parameters())  # tied embeddings counted once
    if lora:
        named = {k: v for k, v in named.items() if k.endswith(".weight") and k.split(".")[-2] in LORA_TARGETS}
    return sum(v.numel() for v in named.values()) * itemsize


def _best(fn, reps: int) -> float:
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def copy_bandwidth(nbytes: int = 2**30, reps: int = 5) -> dict[str, float]:
    """Bytes per second of ``dst.copy_(src)`` (1 GiB, best of ``reps``): ``host``; on a GPU also
    ``h2d`` (pinned host to device) and ``d2d``."""
    import torch

    n = nbytes // 4
    src, dst = torch.ones(n), torch.empty(n)
    dst.copy_(src)  # pages touched
    out = {"host": nbytes / _best(functools.partial(dst.copy_, src), reps)}
    src = dst = None
    if torch.cuda.is_available():
        def synced(f):
            def run():
                f()
                torch.cuda.synchronize()
            return run

        hs, d1, d2 = torch.ones(n).pin_memory(), torch.empty(n, device="cuda"), torch.empty(n, device="cuda")
        synced(lambda: d1.copy_(hs))()
        out["h2d"] = nbytes / _best(synced(lambda: d1.copy_(hs, non_blocking=True)), reps)
        out["d2d"] = nbytes / _best(synced(lambda: d2.copy_(d1)), reps)
        del hs, d1, d2
        torch.cuda.empty_cache()
    return out
