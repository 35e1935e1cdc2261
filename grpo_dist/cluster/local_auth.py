"""Token authentication for the local Ray cluster a driver starts (``ray.init(address="local")``).

A Ray head is remote code execution for whoever reaches its ports, loopback included (every user
of the machine, and any process that reads a port off ``/tmp/ray``). The local cluster therefore
runs with ``RAY_AUTH_MODE=token`` and a token of its own: 256 random bits, made per run, put in
this process's environment as ``RAY_AUTH_TOKEN`` (Ray's first token source, ahead of
``RAY_AUTH_TOKEN_PATH`` and ``~/.ray/auth_token``) just before ``ray.init`` starts GCS and the
raylet, which inherit it, as the workers the raylet starts inherit it from the raylet. It is
never written to a file (Ray writes ``~/.ray/auth_token`` only when token mode finds no token),
never put in a ``runtime_env`` (those are stored in GCS), never printed. A client without it is
refused (``Unauthenticated``).

Every worker drops the token from its environment once connected (:func:`scrub_worker_env`, the
job's ``worker_process_setup_hook``): Ray's core worker read and cached it at start, so the worker
keeps talking to the cluster, while processes that rewards, environments, agents or tools start
from it do not inherit the token. What remains (docs/security.md): GCS and the raylet keep it in
their environment, and ``/proc/<pid>/environ`` shows a process's environment as it started to
processes of the same user: the code tool's sandbox hides them (PID namespace, Landlock).

:func:`restore` puts the environment back as it was once the cluster has shut down, so a later
``ray.init`` in the same process (tests) sees the settings it had. The launch scripts' clusters
(``launch/start_head.sh``) keep their token in a file, shared with the nodes that join.
"""

from __future__ import annotations

import os
import secrets

_VARS = ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH")
SCRUB_HOOK = "grpo_dist.cluster.local_auth.scrub_worker_env"  # a runtime_env's worker_process_setup_hook
_saved: dict[str, str | None] | None = None


def enable() -> dict[str, str]:
    """Turn token authentication on with a fresh token for the local cluster about to start;
    returns the variables the cluster's workers need in their ``runtime_env`` (the mode, not the
    token)."""
    global _saved
    if _saved is None:
        _saved = {k: os.environ.get(k) for k in _VARS}
    os.environ["RAY_AUTH_MODE"] = "token"
    os.environ["RAY_AUTH_TOKEN"] = secrets.token_hex(32)
    os.environ.pop("RAY_AUTH_TOKEN_PATH", None)
    _reload()
    return {"RAY_AUTH_MODE": "token"}


def restore() -> None:
    """The environment as before :func:`enable` (call after ``ray.shutdown()``); no-op otherwise."""
    global _saved
    if _saved is None:
        return
    for k, v in _saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    _saved = None
    _reload()


def _reload() -> None:
    """Make this process's Ray see the environment's mode and token (both are cached once read):
    the config first, then the token cache (Ray's own order, authentication_test_utils)."""
    from ray._raylet import AuthenticationTokenLoader, Config

    Config.initialize("")
    AuthenticationTokenLoader.instance().reset_cache()


def scrub_worker_env() -> None:
    """In a Ray worker, once connected: drop the cluster token from the environment, so processes
    it starts (a reward's, an environment's, an agent's) do not inherit it. Ray reads the token
    once, when the core worker starts, and keeps it (checked by tests/test_local_auth.py: the
    worker still calls tasks and starts actors afterwards)."""
    os.environ.pop("RAY_AUTH_TOKEN", None)


def private_temp_dir() -> str:
    """A fresh directory of mode 0700 for the local cluster's session (Ray's default, /tmp/ray, is
    mode 0777: every user reads its logs, which hold prompts and tracebacks). Kept
    short: Ray puts its sockets ~65 characters beneath it, and a Unix socket's path has 107.
    Returns a name inside that directory: Ray makes the directory it is given mode 0777."""
    import tempfile

    base = tempfile.gettempdir()
    # Ray makes the directory it is given mode 0777: give it one inside the private one
    return os.path.join(tempfile.mkdtemp(prefix="grpo-ray-", dir=base if len(base) <= 32 else "/tmp"), "r")
