"""model.path as a hub id: offline (as every test is) a model in the HF cache is used, one that is
not is a one-line config error; local-looking paths that do not exist stay local errors."""

from __future__ import annotations

import os
import shutil

import pytest

from grpo_dist.config import ConfigError, config_from_dict
from grpo_dist.hub import is_hub_id, local_model_dir
from grpo_dist.run.prepare import prepare_model


def _cfg(path, **model):
    return config_from_dict({"model": {"path": str(path), "max_model_len": 64, **model},
                             "rollout": {"max_tokens": 6}, "logging": {"wandb_mode": "disabled"}})


@pytest.fixture
def hf_cache(tmp_path, monkeypatch):
    """An empty HF hub cache for this test (the hub is offline in tests)."""
    from huggingface_hub import constants

    cache = tmp_path / "hf-cache"
    cache.mkdir()
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    assert os.environ.get("HF_HUB_OFFLINE") == "1"
    return cache


def test_hub_id_or_local_path(tmp_path):
    assert is_hub_id("Qwen/Qwen2.5-0.5B-Instruct") and is_hub_id("openai-community/gpt2")
    for local in ("/models/Qwen2.5-1.5B-Instruct", "./models/x", "../x/y", "~/x/y", "a/b/c", "models", "",
                  str(tmp_path)):
        assert not is_hub_id(local), local


@pytest.mark.parametrize("path", ["/nonexistent/model-dir", "./no/such/dir", "runs/x/y/model"])
def test_missing_local_model_is_a_one_line_config_error(path):
    with pytest.raises(ConfigError) as e:
        prepare_model(_cfg(path), log_fn=lambda m: None)
    assert str(e.value).startswith("model.path: no model at") and "\n" not in str(e.value)


def test_hub_id_not_in_the_cache_offline_is_a_one_line_config_error(hf_cache):
    said = []
    with pytest.raises(ConfigError) as e:
        prepare_model(_cfg("Qwen/Qwen2.5-0.5B-Instruct"), log_fn=said.append)
    msg = str(e.value)
    assert msg.startswith("model.path: 'Qwen/Qwen2.5-0.5B-Instruct' is not a local directory and not in the HF "
                          "cache, and HF_HUB_OFFLINE is set") and "\n" not in msg
    assert said == []  # no download attempted


def test_hub_id_from_the_cache(hf_cache, tiny_model_dir):
    """A model saved into the HF cache layout loads by its hub id, offline: pre-flight's model and
    tokenizer checks, and transformers as the actors load it."""
    snap = hf_cache / "models--acme--tiny-add" / "snapshots" / ("0" * 40)
    shutil.copytree(tiny_model_dir, snap)
    (hf_cache / "models--acme--tiny-add" / "refs").mkdir()
    (hf_cache / "models--acme--tiny-add" / "refs" / "main").write_text("0" * 40)
    cfg = _cfg("acme/tiny-add")
    prepare_model(cfg, log_fn=lambda m: None)
    assert local_model_dir("acme/tiny-add") == snap
    from grpo_dist.run.preflight import check_model

    tok = check_model(cfg)
    assert tok("1+2=")["input_ids"]
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained("acme/tiny-add", cache_dir=str(hf_cache))
    assert model.config.vocab_size == tok.vocab_size or model.config.vocab_size >= len(tok)
