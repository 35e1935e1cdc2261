#!/usr/bin/env bash
# Stop the Ray head or worker that launch/start_head.sh / start_worker.sh started, and nothing else:
#   launch/stop_cluster.sh                 every node these scripts started from this account (all pid files)
#   launch/stop_cluster.sh head|worker     the heads, or the workers, only
#   launch/stop_cluster.sh PIDFILE ...     the ones named (start_*.sh prints its pid file)
# The processes: those the start script recorded, every process Ray started in their session
# (GCS, raylet, dashboard, agents, workers) and their descendants (a job's driver). Never any
# other Ray process of this machine (`ray stop` stops them all). SIGTERM first; SIGKILL for what
# still runs after STOP_TIMEOUT seconds (default 10: the GCS can ignore SIGTERM for 30 s and more).
# Pid files: $GRPO_DIST_PID_DIR (default ~/.ray/grpo_dist).
set -euo pipefail
dir="${GRPO_DIST_PID_DIR:-$HOME/.ray/grpo_dist}"
py="$(command -v python3 || command -v python)"
files=()
if [ $# -eq 0 ]; then set -- head worker; fi
for a in "$@"; do
  case "$a" in
    head|worker) for f in "$dir/$a"-*.json; do if [ -e "$f" ]; then files+=("$f"); fi; done ;;
    *) [ -e "$a" ] || { echo "stop_cluster.sh: no pid file $a" >&2; exit 2; }; files+=("$a") ;;
  esac
done
if [ ${#files[@]} -eq 0 ]; then
  echo "stop_cluster.sh: nothing to stop (no pid file in $dir)"
  exit 0
fi
exec "$py" "$(dirname "$0")/_procs.py" stop --timeout "${STOP_TIMEOUT:-10}" "${files[@]}"
