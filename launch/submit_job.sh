#!/usr/bin/env bash
# Submit a training run as a Ray job to a Ray cluster (launch/start_head.sh's, KubeRay's, any):
#   launch/submit_job.sh CONFIG [--section.key VALUE ...]
# RAY_ADDRESS defaults to the local head's job server (http://127.0.0.1:8265; from another
# machine, tunnel it first: ssh -N -L 8265:127.0.0.1:8265 user@head). Every node needs grpo_dist's
# dependencies installed (docs/multinode.md "Any Ray cluster").
#
# What is uploaded (printed before the job starts): this checkout's grpo_dist/ code, the config,
# the plug-in files it names, and the paths in GRPO_DIST_SUBMIT_INCLUDE; nothing else of the
# current directory (no logs, token files, runs, models or data). A relative output_dir,
# model.path or data path is read and written in the current directory (on the job's node), never
# in Ray's temporary copy. Details: launch/_submit.py.
#
# A cluster with token authentication (the job server answers 401 without one): the token comes
# from RAY_AUTH_TOKEN, or the file RAY_AUTH_TOKEN_PATH (default ~/.ray/auth_token); it
# authenticates this submission and, with WANDB_API_KEY when set, travels to the driver in the
# job's environment. Neither is printed nor put on a command line (other users of this machine
# can read those in `ps`): they go through a private temporary file. A cluster without it (it
# takes any client): one warning line says so, and no token is sent. The driver joins the cluster
# with cluster.address=auto.
# Follow a job: RAY_AUTH_MODE=token ray job status|logs|stop JOB_ID (RAY_ADDRESS as here; without
# the RAY_AUTH_MODE on a cluster without token authentication).
set -euo pipefail
[ $# -ge 1 ] || { echo "usage: submit_job.sh CONFIG [overrides]" >&2; exit 2; }
export RAY_ADDRESS="${RAY_ADDRESS:-http://127.0.0.1:8265}"
py="$(dirname "$(command -v ray || echo /nonexistent/ray)")/python"  # the Python that has Ray (and grpo_dist's deps)
[ -x "$py" ] || py="$(command -v python3 || command -v python)"
exec "$py" "$(dirname "$0")/_submit.py" "$@"
