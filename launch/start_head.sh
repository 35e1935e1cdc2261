#!/usr/bin/env bash
# Start the Ray head node of a grpo_dist cluster, secure by default:
#   launch/start_head.sh [--node-ip-address IP] [--num-gpus N] [extra `ray start` args]
#
# * Token authentication is always on (RAY_AUTH_MODE=token): every GCS/raylet RPC, every job
#   submission and every dashboard request needs the cluster's token. The token is read from
#   $RAY_AUTH_TOKEN_PATH (default ~/.ray/auth_token, Ray's own default) or created there
#   (256 random bits, file mode 600). It is never printed.
# * Where it listens (docs/security.md lists every port and its flag):
#   - by default (no address, or 127.0.0.1): every port on 127.0.0.1, a one-machine cluster.
#     Ray replaces 127.0.0.1 by the host's network address, and then listens on all interfaces,
#     unless RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0: this script sets it for this case.
#   - RAY_NODE_IP or --node-ip-address ADDR (the cluster's private network, never a public one):
#     nodes join at ADDR; Ray then listens on all interfaces for the GCS, the raylet and the
#     dashboard agent's gRPC and metrics ports, and the dashboard's and the autoscaler's metrics
#     ports (DASHBOARD_METRIC_PORT, default 44227; AUTOSCALER_METRIC_PORT, 44217): it has no option to bind them to one address; the
#     token guards the RPC ports, and a firewall should admit only the private network.
# * The dashboard and job server bind to 127.0.0.1 (RAY_DASHBOARD_HOST to change): reach them
#   through an SSH tunnel, `ssh -N -L 8265:127.0.0.1:8265 user@head`.
# * Every process it starts is recorded in a pid file ($GRPO_DIST_PID_DIR, default
#   ~/.ray/grpo_dist, head-PORT.json): launch/stop_cluster.sh stops those and nothing else.
set -euo pipefail

if [ "${RAY_AUTH_MODE:-token}" != "token" ]; then
  echo "start_head.sh: RAY_AUTH_MODE=${RAY_AUTH_MODE} refused: this script only starts heads with token" \
       "authentication (anyone who reaches an open head can run code on every node)" >&2
  exit 2
fi
export RAY_AUTH_MODE=token
py="$(command -v python3 || command -v python)"

node_ip="${RAY_NODE_IP:-127.0.0.1}"
args=()
while [ $# -gt 0 ]; do  # --node-ip-address here overrides RAY_NODE_IP
  case "$1" in
    --node-ip-address) node_ip="${2:?--node-ip-address needs a value}"; shift 2 ;;
    --node-ip-address=*) node_ip="${1#*=}"; shift ;;
    *) args+=("$1"); shift ;;
  esac
done
if [ "$node_ip" = "localhost" ]; then node_ip=127.0.0.1; fi

if [ -n "${RAY_AUTH_TOKEN:-}" ]; then
  token_from="the RAY_AUTH_TOKEN environment variable"
else
  token_path="${RAY_AUTH_TOKEN_PATH:-$HOME/.ray/auth_token}"
  if [ ! -s "$token_path" ]; then
    mkdir -p "$(dirname "$token_path")"
    (umask 077 && "$py" -c 'import secrets; print(secrets.token_hex(32), end="")' > "$token_path")
    echo "created a new cluster token in $token_path (mode 600)"
  fi
  chmod 600 "$token_path"
  export RAY_AUTH_TOKEN_PATH="$token_path"
  token_from="$token_path"
fi

port="${RAY_PORT:-6379}"
dash_host="${RAY_DASHBOARD_HOST:-127.0.0.1}"
dash_port="${RAY_DASHBOARD_PORT:-8265}"
pid_file="${GRPO_DIST_PID_DIR:-$HOME/.ray/grpo_dist}/head-$port.json"
if [ "$node_ip" = "127.0.0.1" ]; then
  export RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0  # else Ray swaps 127.0.0.1 for this host's address
  where="every port on 127.0.0.1 (a one-machine cluster)"
else
  unset RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER
  where="nodes join at $node_ip:$port"
fi
cat <<EOF
starting the Ray head: token authentication on (token from $token_from), $where,
dashboard and job server on $dash_host:$dash_port
EOF
if [ "$node_ip" != "127.0.0.1" ]; then
  echo "note: with a node address other than 127.0.0.1, Ray listens on all interfaces for the GCS (port $port)," \
       "the raylet, the dashboard agent's gRPC and metrics ports, the dashboard's and the autoscaler's metrics ports" \
       "(DASHBOARD_METRIC_PORT, default 44227; AUTOSCALER_METRIC_PORT, 44217); the token guards the RPC ports; let a firewall admit" \
       "only the cluster's private network (docs/security.md)" >&2
fi
if [ "$dash_host" != "127.0.0.1" ] && [ "$dash_host" != "localhost" ]; then
  echo "warning: the dashboard listens on $dash_host; it still needs the token, but prefer 127.0.0.1 + an SSH tunnel" >&2
fi
cat <<EOF
workers:    copy the token file to each node, private (scp -p ${token_path:-<token file>} node:~/.ray/auth_token;
            chmod 600), then on that node: launch/start_worker.sh $node_ip:$port
submitters: RAY_AUTH_TOKEN_PATH=<token file> launch/submit_job.sh configs/<recipe>.yaml
            (from another machine, first: ssh -N -L $dash_port:127.0.0.1:$dash_port <user>@<this head>)
jobs:       RAY_AUTH_MODE=token ray job status|logs|stop JOB_ID --address http://127.0.0.1:$dash_port
stop:       launch/stop_cluster.sh $pid_file
EOF
exec "$py" "$(dirname "$0")/_procs.py" start "$pid_file" head -- \
  ray start --head --disable-usage-stats --node-ip-address "$node_ip" --port "$port" --dashboard-host "$dash_host" \
  --dashboard-port "$dash_port" "${args[@]}"
