"""Process environment defaults, applied by every entry point (CLI, actors, tests) before heavy imports.

Only ``setdefault``: anything the user exported wins.
"""

from __future__ import annotations

import os
from pathlib import Path

# One user-level cache, the same from every directory (a cache under the current directory made a
# run from elsewhere compile DeepSpeed's op again): GRPO_DIST_CACHE, else $XDG_CACHE_HOME/grpo_dist,
# else ~/.cache/grpo_dist.
def project_cache() -> Path:
    """The cache as the environment says now (a test or a launcher may set GRPO_DIST_CACHE after
    import): the converted packaged models, the test models, DeepSpeed's ops, the evaluations."""
    return Path(os.environ.get("GRPO_DIST_CACHE")
                or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "grpo_dist")


PROJECT_CACHE = project_cache()  # as at import (DeepSpeed's ops directory is exported from it)


def setup_env() -> dict[str, str]:
    """Set the defaults this project relies on; return the ones that should travel to Ray workers."""
    defaults = {
        # DeepSpeed compiles its CPU ops once per user (PROJECT_CACHE), whatever the current directory.
        "TORCH_EXTENSIONS_DIR": str(PROJECT_CACHE / "torch_extensions"),
        "TRANSFORMERS_NO_ADVISORY_WARNINGS": "1",
        "TOKENIZERS_PARALLELISM": "false",
        # Ray on loopback only; no token auth for a cluster a test or script starts with ray.init (else
        # Ray 2.59+ writes a token to ~/.ray/auth_token): the runs' local clusters turn it on with a
        # token of their own (cluster/local_auth.py), the launch scripts' clusters with theirs.
        "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
        "RAY_AUTH_MODE": "disabled",
        "RAY_USAGE_STATS_ENABLED": "0",
        "RAY_DEDUP_LOGS": "1",
        # vLLM: no usage stats, warnings only.
        "VLLM_NO_USAGE_STATS": "1",
        "VLLM_DO_NOT_TRACK": "1",
        "VLLM_LOGGING_LEVEL": os.environ.get("VLLM_LOGGING_LEVEL", "WARNING"),
        "WANDB_SILENT": "true",
        "WANDB_DISABLE_CODE": "true",
    }
    for k, v in defaults.items():
        os.environ.setdefault(k, v)
    Path(os.environ["TORCH_EXTENSIONS_DIR"]).mkdir(parents=True, exist_ok=True)
    # not PYTHONPATH: inside a Ray job it points at this node's copy of the working_dir
    # The hub is reachable unless the user exports HF_HUB_OFFLINE=1 (the tests do); the HF
    # settings the user exported travel to the workers (not HF_TOKEN: workers read their node's login).
    hf = ["HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_HOME", "HF_HUB_CACHE", "HF_ENDPOINT"]
    keys = list(defaults) + ["VLLM_CPU_KVCACHE_SPACE", "VLLM_CPU_OMP_THREADS_BIND", "WANDB_MODE", "WANDB_DIR", "GRPO_DIST_CACHE"] + hf
    return {k: os.environ[k] for k in keys if k in os.environ}
