#!/usr/bin/env bash
# Join a grpo_dist Ray cluster (token authentication, as launch/start_head.sh set it up):
#   launch/start_worker.sh <head-ip>:6379 [--node-ip-address THIS_NODE_IP] [--num-gpus N]
# The cluster token: RAY_AUTH_TOKEN, or the file RAY_AUTH_TOKEN_PATH (default ~/.ray/auth_token,
# a private copy of the head's). This node's raylet binds to --node-ip-address (or RAY_NODE_IP);
# use the address on the cluster's private network.
set -euo pipefail
addr="${1:?usage: start_worker.sh HEAD_IP:PORT [ray start args]}"; shift
. "$(dirname "$0")/_token.sh"
find_token start_worker.sh "copy the head's token file here (mode 600) or set RAY_AUTH_TOKEN_PATH"
extra=()
if [ -n "${RAY_NODE_IP:-}" ]; then extra=(--node-ip-address "$RAY_NODE_IP"); fi
exec ray start --address "$addr" --disable-usage-stats "${extra[@]}" "$@"
