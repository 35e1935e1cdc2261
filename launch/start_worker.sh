#!/usr/bin/env bash
# Join a grpo_dist Ray cluster:  launch/start_worker.sh <head-ip>:6379 [--num-gpus N]
set -euo pipefail
addr="${1:?usage: start_worker.sh HEAD_IP:PORT [ray start args]}"; shift
export RAY_AUTH_MODE="${RAY_AUTH_MODE:-disabled}"
ray start --address "$addr" "$@"
