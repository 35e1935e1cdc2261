"""The tiny model's architecture: a seeded ``LlamaForCausalLM`` in two sizes.

vLLM's CPU build needs head_dim >= 32: both sizes have it.
"""

from __future__ import annotations

import torch

SIZES: dict[str, dict[str, int]] = {
    "tiny": dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2),
    "small": dict(hidden_size=512, intermediate_size=1408, num_hidden_layers=8,
                  num_attention_heads=8, num_key_value_heads=4),
}
MAX_POSITIONS = 256


def build_model(tokenizer, size: str = "tiny", seed: int = 0):
    """A freshly initialised, seeded ``LlamaForCausalLM`` sized by ``SIZES[size]``."""
    from transformers import LlamaConfig, LlamaForCausalLM

    if size not in SIZES:
        raise ValueError(f"unknown size {size!r}; expected one of {sorted(SIZES)}")
    dims = SIZES[size]
    config = LlamaConfig(
        vocab_size=len(tokenizer), max_position_embeddings=MAX_POSITIONS,
        rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=False,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id, head_dim=dims["hidden_size"] // dims["num_attention_heads"],
        **dims,
    )
    torch.manual_seed(seed)
    return LlamaForCausalLM(config).float()
