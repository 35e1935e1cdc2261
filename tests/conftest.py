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


@pytest.fixture(scope="session")
def pretrained_model_dir() -> Path:
    """The demo's base model: tiny Llama pretrained on noisy addition labels (partly right).

    Generation is seeded and deterministic, so it is cached under .cache/test-models and reused
    by later sessions on the same checkout (a fresh clone builds it once, ~1-2 min).
    """
    import hashlib

    import grpo_dist.data.synthetic as synthetic
    import grpo_dist.models.tiny as tiny

    # keyed by the generator's source, so a change to the recipe never reuses a stale model
    digest = hashlib.sha1(Path(tiny.__file__).read_bytes() + Path(synthetic.__file__).read_bytes()).hexdigest()[:10]
    out = Path(__file__).resolve().parents[1] / ".cache" / "test-models" / f"tiny-add-seed0-{digest}"
    INFO_FILE, make_tiny_model = tiny.INFO_FILE, tiny.make_tiny_model
    if not (out / INFO_FILE).is_file():
        make_tiny_model(str(out), size="tiny", seed=0, pretrain_task="add", log=None)
    return out
