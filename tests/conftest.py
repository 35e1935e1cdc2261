"""Shared fixtures. Expensive things (models, Ray, vLLM engines) are built once per session."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from grpo_dist.env import setup_env

setup_env()
os.environ.setdefault("WANDB_MODE", "offline")


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    """An untrained seeded tiny Llama + char tokenizer (transformers, PEFT and vLLM load it)."""
    from grpo_dist.models.tiny import make_tiny_model

    out = tmp_path_factory.mktemp("models") / "tiny"
    make_tiny_model(out, size="tiny", seed=0, log=lambda *a, **k: None)
    return out
