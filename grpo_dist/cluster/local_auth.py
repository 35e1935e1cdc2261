"""Token authentication for the local Ray cluster a driver starts (``ray.init(address="local")``).

A Ray head is remote code execution for whoever reaches its ports, loopback included (every user
of the machine, and any process that reads a port off ``/tmp/ray``). The local cluster therefore
runs with ``RAY_AUTH_MODE=token`` and a token of its own: 256 random bits, made per run, put in
this process's environment as ``RAY_AUTH_TOKEN`` (Ray's first token source, ahead of
``RAY_AUTH_TOKEN_PATH`` and ``~/.ray/auth_token``) just before ``ray.init`` starts GCS and the
raylet, which inherit it, as the workers the raylet starts inherit it from the raylet. It is
never written to a file (Ray writes ``~/.ray/auth_token`` only when token mode finds no token),
never put in a ``runtime_env`` (those are stored in GCS), never printed. A client without it is
refused (``Unauthenticated``); a process of this run that needs to reach the cluster (the run's
own subprocesses inherit the environment) gets in.

:func:`restore` puts the environment back as it was once the cluster has shut down, so a later
``ray.init`` in the same process (tests) sees the settings it had. The launch scripts' clusters
(``launch/start_head.sh``) keep their token in a file, shared with the nodes that join.
"""

from __future__ import annotations

import os
import secrets

_VARS = ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH")
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
