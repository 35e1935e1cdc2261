"""Hugging Face Hub model ids for ``model.path``.

``model.path`` is a local model directory, or a hub id (``Qwen/Qwen2.5-0.5B-Instruct``). A hub
model is fetched once into the HF cache on the driver before any actor starts (errors are one
line naming ``model.path``); vLLM and transformers in the actors then load the same id from that
cache (on another node they fetch it into theirs). ``HF_HUB_OFFLINE=1`` (exported by the user;
the tests set it) means the cache only: a model not in it is a config error, never a download.

``pkg:<name>`` (a model a Python package ships as GGUF) and a local ``*.gguf`` file behave like a
hub id: the driver converts them once into the project cache (grpo_dist/models/gguf_source.py)
and pre-flight points ``model.path`` at the converted directory.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Callable

# org/name as the hub spells them: one slash, no leading dot, no path syntax
_HUB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*")
# what a training run needs from a model repo: configs, tokenizer files, safetensors weights
_SKIP = ["*.pth", "*.pt", "*.gguf", "*.onnx", "*.h5", "*.msgpack", "*.ot", "original/*", "onnx/*"]

__all__ = ["fetch_model", "is_hub_id", "is_model_source", "local_model_dir", "offline"]


def offline() -> bool:
    """True when ``HF_HUB_OFFLINE`` asks for the cache only."""
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def is_hub_id(path: str) -> bool:
    """``org/name`` that does not exist as a local path (``./x/y``, ``/x/y``, ``~/x``, ``a/b/c``
    are local paths), or a packaged/GGUF model source (``pkg:<name>``, ``*.gguf``)."""
    return is_model_source(path) or (bool(_HUB_ID.fullmatch(path)) and not os.path.exists(path))


def is_model_source(path: str) -> bool:
    """``pkg:<name>`` or a ``*.gguf`` file: converted to a local directory on first use."""
    return isinstance(path, str) and (path.startswith("pkg:") or path.lower().endswith(".gguf"))


def fetch_model(repo_id: str, log_fn: Callable[[str], None] = print) -> Path:
    """The local snapshot directory of ``repo_id`` in the HF cache, downloaded if needed (not in
    offline mode); for ``pkg:``/``*.gguf`` the converted directory. Raises ``ValueError`` with one
    line saying why it cannot be had."""
    if is_model_source(repo_id):
        from grpo_dist.models.gguf_source import resolve

        return resolve(repo_id, log_fn)
    from huggingface_hub import snapshot_download

    try:  # the cache first: no network call when it is there
        return Path(snapshot_download(repo_id, local_files_only=True, ignore_patterns=_SKIP))
    except Exception as e:  # noqa: BLE001 - not (completely) in the cache
        if offline():
            raise ValueError(f"{repo_id!r} is not a local directory and not in the HF cache, and HF_HUB_OFFLINE "
                             f"is set (unset it to download, or give a local model directory)") from e
    log_fn(f"model.path {repo_id}: downloading from the Hugging Face Hub into the HF cache")
    try:
        return Path(snapshot_download(repo_id, ignore_patterns=_SKIP))
    except Exception as e:  # noqa: BLE001 - not found, gated, no network: one line
        first = (str(e).strip().splitlines() or [type(e).__name__])[0][:300]
        raise ValueError(f"{repo_id!r} is not a local directory, and fetching it from the Hugging Face Hub "
                         f"failed: {type(e).__name__}: {first}") from e


def local_model_dir(path: str) -> Path:
    """``path`` itself, or for a hub id its snapshot in the HF cache (after :func:`fetch_model`)."""
    if (Path(path) / "config.json").is_file() or not is_hub_id(path):
        return Path(path)
    return fetch_model(path)
