"""Locally generated models (no model hub): a seeded tiny Llama with a character tokenizer."""

from grpo_dist.models.tiny import SIZES, build_tokenizer, evaluate, generate, make_tiny_model

__all__ = ["SIZES", "build_tokenizer", "evaluate", "generate", "make_tiny_model"]
