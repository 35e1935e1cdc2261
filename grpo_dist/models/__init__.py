"""Locally generated models (no model hub): a seeded tiny Llama with a character tokenizer."""

from grpo_dist.models.heldout import evaluate, generate
from grpo_dist.models.model import SIZES, build_model
from grpo_dist.models.pretrain import pretrain
from grpo_dist.models.tiny import INFO_FILE, make_tiny_model
from grpo_dist.models.tokenizer import build_tokenizer

__all__ = ["INFO_FILE", "SIZES", "build_model", "build_tokenizer", "evaluate", "generate", "make_tiny_model",
           "pretrain"]
