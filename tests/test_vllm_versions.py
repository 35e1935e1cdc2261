"""The vLLM releases grpo_dist supports (0.26.x, what GPU images with torch 2.11 can carry, and
0.32.x, the CPU pin): what differs lives in grpo_dist/rollout/vllm_compat.py; tests/vllm_probe.py
runs the project's vLLM calls on a real CPU engine of either.

The vLLM 0.26 tests need a second venv (vLLM's CPU build 0.26.0 with PyPI's torch 2.11.0):
``tests/vllm026_venv.sh`` builds it (~6 GB, a few minutes); they look for it at
``$GRPO_DIST_VLLM026_PYTHON`` or ``<GRPO_DIST_CACHE or .cache>/vllm026-venv/bin/python``.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from grpo_dist.rollout import vllm_compat

ROOT = Path(__file__).resolve().parents[1]


def vllm026_python() -> Path:
    env = os.environ.get("GRPO_DIST_VLLM026_PYTHON")
    if env:
        return Path(env)
    return Path(os.environ.get("GRPO_DIST_CACHE", ROOT / ".cache")) / "vllm026-venv" / "bin" / "python"


def probe(python, model_dir, work, *sections) -> tuple[dict, str]:
    """Runs tests/vllm_probe.py; returns {section: values} and the process's whole output."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "tests")]),
               VLLM_CPU_KVCACHE_SPACE="1", VLLM_CPU_OMP_THREADS_BIND="0")
    env.pop("VLLM_LOGGING_CONFIG_PATH", None)
    p = subprocess.run([str(python), str(ROOT / "tests" / "vllm_probe.py"), str(model_dir), str(work), *sections],
                       capture_output=True, text=True, env=env, timeout=1500)
    out = {}
    for line in p.stdout.splitlines():
        if line.startswith("PROBE "):
            _, name, payload = line.split(" ", 2)
            out[name] = json.loads(payload)
    log = p.stdout + p.stderr
    assert p.returncode == 0 and "version" in out, log[-6000:]
    for name in sections:
        assert "error" not in out.get(name, {"error": "missing"}), (name, out.get(name), log[-4000:])
    return out, log


# -- fast: the compat module --------------------------------------------------------------------

def test_versions_are_parsed_and_the_supported_range_is_checked(caplog):
    assert vllm_compat.parse_version("0.32.0") == (0, 32, 0)
    assert vllm_compat.parse_version("0.26.0+cpu") == (0, 26, 0)
    assert vllm_compat.parse_version("0.27.1rc2.dev3+g1234") == (0, 27, 1)
    with pytest.raises(ValueError):
        vllm_compat.parse_version("dev")
    assert vllm_compat.check_supported((0, 26, 0)) and vllm_compat.check_supported((0, 32, 5))
    with caplog.at_level(logging.WARNING, logger="grpo_dist.rollout"):
        assert not vllm_compat.check_supported((0, 25, 1)) and not vllm_compat.check_supported((0, 33, 0))
    assert "0.25.1 is outside" in caplog.text and "0.33.0 is outside" in caplog.text
    assert vllm_compat.check_supported()  # the installed one


def test_reload_loggers_follow_the_installed_release():
    """0.32 logs the per-reload notice from reload/inplace.py (quieted by logger level); 0.26 has
    no such module and logs it from the model runner (a filter takes that one message out)."""
    import vllm.model_executor.model_loader.reload.inplace  # noqa: F401  (0.32: the module exists)

    assert vllm_compat.reload_loggers() == (vllm_compat.LAYERWISE_LOGGER, vllm_compat.INPLACE_LOGGER)


def test_the_not_loaded_filter_drops_that_notice_only(monkeypatch):
    from grpo_dist.rollout import vllm_plugin

    logger = logging.getLogger(vllm_compat.RUNNER_LOGGER)
    monkeypatch.setattr(logger, "filters", [])
    monkeypatch.delenv(vllm_plugin.ENV, raising=False)
    monkeypatch.delenv(vllm_compat.QUIET_RELOAD_ENV, raising=False)
    vllm_plugin.register()
    assert logger.filters == []  # not asked for: vLLM's logging untouched
    monkeypatch.setenv(vllm_compat.QUIET_RELOAD_ENV, "1")
    vllm_plugin.register()
    vllm_plugin.register()
    assert [type(f) for f in logger.filters] == [vllm_compat.NotLoadedFilter]

    def record(msg):
        return logging.LogRecord(logger.name, logging.WARNING, __file__, 1, msg, ({"a.weight"},), None)

    assert not logger.filter(record("Following weights were not loaded from checkpoint: %s"))
    assert logger.filter(record("Some other warning: %s"))


def test_cpu_engines_run_without_chunked_prefill_and_a_budget_of_at_least_max_model_len(tiny_model_dir):
    from grpo_dist.rollout.vllm_engine import engine_kwargs

    assert vllm_compat.cpu_prefill_kwargs(256) == {"enable_chunked_prefill": False}  # vLLM's budget, raised by vLLM
    kw = engine_kwargs(str(tiny_model_dir), max_model_len=256, max_num_batched_tokens=64)
    assert kw["enable_chunked_prefill"] is False and kw["max_num_batched_tokens"] == 256
    assert engine_kwargs(str(tiny_model_dir), max_model_len=256, max_num_batched_tokens=8192)["max_num_batched_tokens"] == 8192
    kw = engine_kwargs(str(tiny_model_dir), max_model_len=256, worker_extension_cls="pkg.mod.Ext")
    assert kw["worker_extension_cls"] == "pkg.mod.Ext" and "max_num_batched_tokens" not in kw


def test_the_gpu_extra_keeps_the_torch_of_gpu_images():
    """vLLM 0.26.x pins torch 2.11.0 (what GPU images ship); 0.27 and later pin newer torch, so
    pip, which takes the newest vLLM a range allows, would replace the image's torch
    (measured: ``vllm>=0.26,<0.33`` on torch 2.11 resolves to vllm 0.32.0 + torch 2.13.0)."""
    from packaging.requirements import Requirement

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    (gpu,) = [Requirement(r) for r in extras["gpu"] if r.startswith("vllm")]
    assert gpu.specifier.contains("0.26.0") and gpu.specifier.contains("0.26.3")
    assert not gpu.specifier.contains("0.27.0") and not gpu.specifier.contains("0.32.0")
    (latest,) = [Requirement(r) for r in extras["gpu-vllm032"]]
    assert latest.name == "vllm" and latest.specifier.contains("0.32.0")


# -- slow: real CPU engines -------------------------------------------------------------------------

@pytest.mark.slow
def test_seeded_prompts_over_the_prefill_budget_do_not_crash_the_engine(tiny_model_dir, tmp_path):
    """18 seeded requests of 20-token prompts (360 tokens) against a prefill budget of 64: with
    grpo_dist's engine arguments every sample completes and equals its prompt run alone; the
    same batch with vLLM's chunked prefill (budget 16) kills the engine (the control)."""
    out, log = probe(sys.executable, tiny_model_dir, tmp_path, "prefill", "control")
    pre, ctl = out["prefill"], out["control"]
    assert pre["chunked_prefill"] is False and pre["budget"] == 64 < pre["prompt_tokens"] == 360
    assert pre["samples"] == 18 and pre["same_as_solo"] and pre["solo_logprob_diff"] < 1e-5
    assert ctl["chunked_prefill"] is True and ctl["crashed"], ctl
    assert "CPU Generator does not use offset" in log


@pytest.mark.slow
@pytest.mark.skipif(not vllm026_python().exists(),
                    reason=f"no vLLM 0.26 venv at {vllm026_python()} (build it with tests/vllm026_venv.sh)")
def test_the_project_vllm_calls_on_vllm_026(tiny_model_dir, tmp_path):
    """Everything grpo_dist asks of vLLM, on vLLM 0.26.0's CPU build: seeded batches over the
    prefill budget (and the control crash), LoRA versions (add/remove), full weights reloaded from
    files and loaded in place by a worker extension over collective_rpc, sleep/wake_up, the
    async engine; log-probs against transformers/PEFT."""
    out, log = probe(vllm026_python(), tiny_model_dir, tmp_path, "prefill", "control", "lora", "full", "async")
    assert out["version"]["vllm"].startswith("0.26.")
    pre, ctl, lora, full, asy = (out[k] for k in ("prefill", "control", "lora", "full", "async"))
    assert pre["chunked_prefill"] is False and pre["same_as_solo"] and pre["samples"] == 18
    assert ctl["crashed"] and "CPU Generator does not use offset" in log
    assert lora["peft_diff"] < 1e-4 and lora["base_diff"] < 1e-4
    assert lora["loaded_after_v2"] == [2] and lora["loaded_after_base"] == []
    assert full["info"][0]["worker"] == "CPUWorker" and full["reload_diff"] < 1e-4 and full["rpc_diff"] < 1e-4
    assert full["log_filters"] == [["NotLoadedFilter"]]
    assert "Following weights were not loaded" not in log and "Failed to load weights" not in log
    assert asy["versions"] == [0, 0, 1, 1] and asy["peft_diff"] < 1e-4
    assert asy["base_tokens"] == pre["tokens"]  # seeded: the async engine samples what the batch engine did
