"""Per-trajectory multi-turn rollouts on vLLM's async engine (grpo_dist/rollout/turns_async.py)
against the lock-step loop on vLLM's batch engine: same model, prompts, seeds and a scripted tool
environment with seeded latencies and lengths -- the same tokens and masks. Runs
benchmarks/env_throughput.py in a subprocess (real vLLM CPU engines want a __main__ guard)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_per_trajectory_async_samples_what_lock_step_samples(pretrained_model_dir):
    env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE="1", PYTHONPATH=str(ROOT))
    p = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "env_throughput.py"), "--model",
                        str(pretrained_model_dir), "--prompts", "4", "--group", "4", "--max-tokens", "8",
                        "--max-model-len", "128", "--latency", "0.2"],
                       capture_output=True, text=True, env=env, timeout=1200)
    line = [ln for ln in p.stdout.splitlines() if ln.startswith("ENV_THROUGHPUT ")]
    assert p.returncode == 0 and line, p.stdout[-2000:] + p.stderr[-4000:]
    out = json.loads(line[0][len("ENV_THROUGHPUT "):])
    assert out["same_tokens"], out
    a, b = out["lock_step"], out["per_trajectory"]
    assert a["trajectories"] == b["trajectories"] == 16 and a["turns"] == b["turns"] > 16  # several turns each
