#!/usr/bin/env bash
# Submit a training run as a Ray job to a head started by launch/start_head.sh:
#   launch/submit_job.sh CONFIG [--section.key VALUE ...]
# RAY_ADDRESS defaults to the local head's job server (http://127.0.0.1:8265; from another
# machine, tunnel it first: ssh -N -L 8265:127.0.0.1:8265 user@head).
#
# The cluster token comes from RAY_AUTH_TOKEN, or the file RAY_AUTH_TOKEN_PATH (default
# ~/.ray/auth_token); it authenticates this submission and, with WANDB_API_KEY when set, travels
# to the driver in the job's environment. Neither is printed nor put on a command line (other
# users of this machine can read those in `ps`): they go through a private temporary file.
# The working directory (this repo, minus .venv/runs/models/...) is shipped to the cluster; the
# driver joins the cluster with cluster.address=auto.
set -euo pipefail
cfg="${1:?usage: submit_job.sh CONFIG [overrides]}"; shift
export RAY_ADDRESS="${RAY_ADDRESS:-http://127.0.0.1:8265}"
. "$(dirname "$0")/_token.sh"
find_token submit_job.sh "set RAY_AUTH_TOKEN_PATH to a copy of the head's token file (start_head.sh says where it is)"

env_file="$(umask 077 && mktemp "${TMPDIR:-/tmp}/grpo_dist_job_env.XXXXXX")"
trap 'rm -f "$env_file"' EXIT
python - "$env_file" <<'EOF'
import json, os, sys
from pathlib import Path

token = os.environ.get("RAY_AUTH_TOKEN") or Path(os.environ["RAY_AUTH_TOKEN_PATH"]).read_text().strip()
env = {"HF_HUB_OFFLINE": os.environ.get("HF_HUB_OFFLINE", "0"),  # the hub unless offline here
       "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token,
       # a relative output_dir resolves against this directory, not Ray's copy of the working dir
       "GRPO_DIST_SUBMIT_DIR": os.getcwd()}
if os.environ.get("WANDB_API_KEY"):
    env["WANDB_API_KEY"] = os.environ["WANDB_API_KEY"]
runtime_env = {"excludes": [".venv", ".cache", "runs", "models", ".git", "wandb"], "env_vars": env}
Path(sys.argv[1]).write_text(json.dumps(runtime_env))  # JSON is YAML: `--runtime-env` reads it
EOF
ray job submit --working-dir . --runtime-env "$env_file" \
  -- python -m grpo_dist.cli train --config "$cfg" --cluster.address auto "$@"
