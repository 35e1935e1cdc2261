#!/usr/bin/env bash
# Submit a training run as a Ray job:
#   launch/submit_job.sh CONFIG [--section.key VALUE ...]
# RAY_ADDRESS defaults to the local head's job server (http://127.0.0.1:8265).
# The working directory (this repo, minus .venv/runs/models via .gitignore-style excludes)
# is shipped to the cluster; the driver joins the cluster with cluster.address=auto.
set -euo pipefail
cfg="${1:?usage: submit_job.sh CONFIG [overrides]}"; shift
export RAY_ADDRESS="${RAY_ADDRESS:-http://127.0.0.1:8265}"
export RAY_AUTH_MODE="${RAY_AUTH_MODE:-disabled}"
exec ray job submit --working-dir . \
  --runtime-env-json '{"excludes": [".venv", ".cache", "runs", "models", ".git", "wandb"], "env_vars": {"HF_HUB_OFFLINE": "1"}}' \
  -- python -m grpo_dist.cli train --config "$cfg" --cluster.address auto "$@"
