#!/usr/bin/env bash
# Start the Ray head node of a grpo_dist cluster.
#   launch/start_head.sh [--num-gpus N] [extra `ray start` args]
# Then on every other node: launch/start_worker.sh <head-ip>:6379
set -euo pipefail
export RAY_AUTH_MODE="${RAY_AUTH_MODE:-disabled}"   # Ray 2.60 enables token auth by default
ray start --head --port "${RAY_PORT:-6379}" --dashboard-host "${RAY_DASHBOARD_HOST:-127.0.0.1}" \
  --dashboard-port "${RAY_DASHBOARD_PORT:-8265}" "$@"
echo "head up; submit with: launch/submit_job.sh configs/<recipe>.yaml"
