"""Everything that differs between the vLLM releases grpo_dist runs on, in one place.

Supported: vLLM 0.26.x (the newest release whose CUDA wheel pins torch 2.11, the torch GPU images
carry; pyproject's ``gpu`` extra) and 0.32.x (the CPU build, ``cpu`` extra, what CI runs). Every
vLLM call the project makes was read in both sources (NOTES.md has the table); the engine
arguments, ``LLM.generate`` / ``sleep`` / ``wake_up`` / ``collective_rpc`` / ``reset_prefix_cache``,
``LoRARequest``, ``LLMEngine.add_lora`` / ``remove_lora``, ``AsyncLLM`` and the worker extension
mechanism are the same in both. What differs is here, detected by feature where vLLM offers one:

* the logger of the per-reload "Following weights were not loaded" notice;
* a workaround for a bug both have (:func:`cpu_prefill_kwargs`).

Nothing here imports vLLM at module import time.
"""

from __future__ import annotations

import functools
import logging
import re

log = logging.getLogger("grpo_dist.rollout")

SUPPORTED = ((0, 26), (0, 32))  # oldest and newest (major, minor) read and tested

# layerwise reload: "<layer>: Failed to load weights" for every layer a reload leaves alone (both)
LAYERWISE_LOGGER = "vllm.model_executor.model_loader.reload.layerwise"
# "Following weights were not loaded from checkpoint: {...}" once per reload: 0.32 logs it from
# reload/inplace.py, 0.26 from the model runner (whose other warnings must stay: filtered by text)
INPLACE_LOGGER = "vllm.model_executor.model_loader.reload.inplace"
RUNNER_LOGGER = "vllm.v1.worker.gpu_model_runner"
NOT_LOADED_NOTICE = "Following weights were not loaded"
QUIET_RELOAD_ENV = "GRPO_DIST_VLLM_QUIET_RELOAD"  # set: the plugin installs NotLoadedFilter


def parse_version(text: str) -> tuple[int, int, int]:
    """``"0.26.0"``, ``"0.32.0+cpu"``, ``"0.27.1rc2.dev3"`` -> (major, minor, patch)."""
    m = re.match(r"(\d+)\.(\d+)(?:\.(\d+))?", text)
    if m is None:
        raise ValueError(f"not a vLLM version: {text!r}")
    return int(m.group(1)), int(m.group(2)), int(m.group(3) or 0)


@functools.cache
def vllm_version() -> tuple[int, int, int]:
    import vllm

    return parse_version(vllm.__version__)


def check_supported(version: tuple[int, int, int] | None = None) -> bool:
    """Whether ``version`` (default: the installed vLLM) is in :data:`SUPPORTED`; warns once if not."""
    v = version or vllm_version()
    ok = SUPPORTED[0] <= v[:2] <= SUPPORTED[1]
    if not ok:
        _warn_unsupported(v)
    return ok


@functools.cache
def _warn_unsupported(v: tuple[int, int, int]) -> None:
    lo, hi = (".".join(map(str, s)) for s in SUPPORTED)
    log.warning("vLLM %s is outside the releases grpo_dist was checked against (%s.x to %s.x); "
                "see NOTES.md 'vLLM versions'", ".".join(map(str, v)), lo, hi)


def reload_loggers() -> tuple[str, ...]:
    """The loggers whose per-reload warnings are noise for merged/full-weight serving, set to
    ERROR in the engine processes. 0.26's "not loaded" notice comes from the model runner's
    logger instead: :class:`NotLoadedFilter` drops just that message there."""
    import importlib.util
    from pathlib import Path

    spec = importlib.util.find_spec("vllm")  # the file, not an import of vLLM's model code
    root = Path(next(iter(spec.submodule_search_locations))) if spec and spec.submodule_search_locations else None
    has_inplace = root is not None and (root / "model_executor/model_loader/reload/inplace.py").is_file()  # 0.32
    return (LAYERWISE_LOGGER, INPLACE_LOGGER) if has_inplace else (LAYERWISE_LOGGER,)


class NotLoadedFilter(logging.Filter):
    """Drops vLLM's "Following weights were not loaded from checkpoint" notice (every other record
    of the logger passes)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(NOT_LOADED_NOTICE)


def install_not_loaded_filter() -> None:
    """In a vLLM process (from the plugin): drop the notice where 0.26 logs it. Idempotent."""
    logger = logging.getLogger(RUNNER_LOGGER)
    if not any(isinstance(f, NotLoadedFilter) for f in logger.filters):
        logger.addFilter(NotLoadedFilter())


def cpu_prefill_kwargs(max_model_len: int, max_num_batched_tokens: int | None = None) -> dict:
    """Engine arguments that keep a CPU engine alive with seeded requests.

    vLLM (0.26 and 0.32 alike) rewinds a request's own ``torch.Generator`` after a prefill chunk
    whose sampled token is discarded (``gen.set_offset(gen.get_offset() - 4)`` in the model
    runner's ``_bookkeeping_sync``); a CPU generator has no offset, so the engine dies with
    ``RuntimeError: CPU Generator does not use offset`` as soon as a seeded request's prefill is
    split. grpo_dist seeds every sample, and G chat prompts exceed the CPU build's prefill budget
    (4096 tokens) at once. Without chunked prefill vLLM schedules whole prompts only, as many as
    fit the budget, and the rest wait for the next step; the budget must then hold the longest
    prompt, so it is raised to at least ``max_model_len`` (None: vLLM's default, which vLLM
    itself raises to ``max_model_len`` in both versions)."""
    kwargs: dict = {"enable_chunked_prefill": False}
    if max_num_batched_tokens is not None:
        if max_num_batched_tokens < max_model_len:
            log.info("max_num_batched_tokens %d raised to max_model_len %d (no chunked prefill on CPU)",
                     max_num_batched_tokens, max_model_len)
        kwargs["max_num_batched_tokens"] = max(max_num_batched_tokens, max_model_len)
    return kwargs


def check_inflight_support(async_llm_cls) -> None:
    """In-flight updates (``rollout.inflight_updates``) need vLLM 0.32's keep-mode pause and its
    per-token weight-version spans (``CompletionOutput.weight_versions``); one line if missing."""
    import inspect

    import vllm.outputs

    pause = getattr(async_llm_cls, "pause_generation", None)
    ok = (pause is not None and "mode" in inspect.signature(pause).parameters
          and hasattr(async_llm_cls, "update_weight_version") and hasattr(vllm.outputs, "WeightVersionSpan"))
    if not ok:
        raise RuntimeError(f"rollout.inflight_updates needs vLLM's keep-mode pause and weight-version spans "
                           f"(vLLM 0.32); this is vLLM {'.'.join(map(str, vllm_version()))}: set "
                           f"rollout.inflight_updates false (the engine then drains before each load)")
