#!/usr/bin/env bash
# Join a grpo_dist Ray cluster (token authentication, as launch/start_head.sh set it up):
#   launch/start_worker.sh <head-ip>:6379 [--node-ip-address THIS_NODE_IP] [--num-gpus N]
# The cluster token: RAY_AUTH_TOKEN, or the file RAY_AUTH_TOKEN_PATH (default ~/.ray/auth_token,
# a private copy of the head's). This node registers with --node-ip-address (or RAY_NODE_IP): use
# its address on the cluster's private network. Like the head's, its raylet and agents listen on
# all interfaces (docs/security.md). Every process it starts is recorded in a
# pid file ($GRPO_DIST_PID_DIR, default ~/.ray/grpo_dist, worker-HEAD-PORT.json):
# launch/stop_cluster.sh stops those and nothing else.
set -euo pipefail
addr="${1:?usage: start_worker.sh HEAD_IP:PORT [ray start args]}"; shift
. "$(dirname "$0")/_token.sh"
find_token start_worker.sh "copy the head's token file here (mode 600) or set RAY_AUTH_TOKEN_PATH"
unset RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER  # "0" (a loopback head's setting) refuses to join a cluster
py="$(command -v python3 || command -v python)"
extra=()
if [ -n "${RAY_NODE_IP:-}" ]; then extra=(--node-ip-address "$RAY_NODE_IP"); fi
pid_file="${GRPO_DIST_PID_DIR:-$HOME/.ray/grpo_dist}/worker-${addr//[:\/]/-}.json"
echo "stop:       launch/stop_cluster.sh $pid_file"
exec "$py" "$(dirname "$0")/_procs.py" start "$pid_file" worker -- \
  ray start --address "$addr" --disable-usage-stats "${extra[@]}" "$@"
