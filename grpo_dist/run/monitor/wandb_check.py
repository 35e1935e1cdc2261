"""W&B online mode, decided before Ray starts (pre-flight) and by the same rule for the monitor.

``wandb.init(mode="online")`` finds a bad key only once the run has started (a traceback out of
``wandb.init``, the actors up), and an unreachable server only after ~100 s of its retries (then a
``CommError`` traceback, exit 1). So, for ``logging.wandb_mode: online``, in this order:

* the key, from where wandb reads it: ``WANDB_API_KEY``, else the netrc entry ``wandb login``
  wrote for the server's host (``NETRC``, else ``~/.netrc``); none, or one that wandb's own format
  rule refuses, is a ConfigError (never the key itself in the line);
* the server (``WANDB_BASE_URL``, else the ``base_url`` ``wandb login --host`` saved, else
  api.wandb.ai) is asked who the key belongs to, at most ``PROBE_S`` seconds: a 401 is a
  ConfigError; no answer (refused, DNS, a firewall dropping packets, any other status) means
  offline: one warning line, and the run's W&B files stay under ``output_dir/wandb`` for ``wandb
  sync`` (the summary prints the command).

No wandb import (about a second): the format rule is copied from wandb 0.31's
``wandb/sdk/lib/wbauth/validation.py`` (``tests/test_wandb_online.py`` checks it against the
installed one); the question is one HTTP request (the GraphQL ``viewer``, the key as wandb sends
it: basic auth, user ``api``). The decision is kept per (server, key) in this process, so the
monitor the run makes later asks nothing again.
"""

from __future__ import annotations

import base64
import configparser
import hashlib
import json
import netrc
import os
import re
import threading
import urllib.error
import urllib.request
from pathlib import Path
from typing import Callable
from urllib.parse import urlsplit

from grpo_dist.config import ConfigError

DEFAULT_URL = "https://api.wandb.ai"
PROBE_S = 5.0  # the most the server's answer may take before the run goes offline
_JWT = re.compile(r"[\w-]+\.[\w-]+\.[\w-]+")
_decided: dict[tuple[str, str], str] = {}


def forget() -> None:
    """Drop the decisions taken in this process (tests)."""
    _decided.clear()


def key_problem(key: str) -> str | None:
    """Why wandb would refuse ``key``'s form, or None: a JWT (three dot-separated segments), or
    40+ word characters, optionally after a ``<prefix>-`` (on-prem and wandb 0.31's newer keys);
    no surrounding whitespace (wandb's settings refuse it)."""
    if not key:
        return "it is empty"
    if key != key.strip():
        return "it starts or ends with whitespace"
    if _JWT.fullmatch(key):
        return None
    secret = key.split("-", 1)[-1]
    if not re.fullmatch(r"[\w-]+", secret):
        return "it may hold only letters, digits and underscores (after an optional '<prefix>-')"
    if len(secret) < 40:
        return f"W&B keys have 40 or more characters, this one has {len(secret)}"
    return None


def base_url() -> str:
    """The W&B server wandb will talk to: ``WANDB_BASE_URL``, else the ``base_url`` in wandb's
    settings file (``wandb login --host``), else api.wandb.ai."""
    if os.environ.get("WANDB_BASE_URL"):
        return os.environ["WANDB_BASE_URL"].rstrip("/")
    settings = Path(os.environ.get("WANDB_CONFIG_DIR") or Path.home() / ".config" / "wandb") / "settings"
    parser = configparser.ConfigParser()
    try:
        parser.read(settings)
        return parser.get("default", "base_url", fallback=DEFAULT_URL).rstrip("/") or DEFAULT_URL
    except (OSError, configparser.Error):
        return DEFAULT_URL


def api_key(url: str) -> tuple[str | None, str]:
    """(the key, where it came from) as wandb finds it: ``WANDB_API_KEY``, else the netrc
    password for the server's host; (None, "") when neither has one."""
    if os.environ.get("WANDB_API_KEY"):
        return os.environ["WANDB_API_KEY"], "WANDB_API_KEY"
    path = Path(os.environ.get("NETRC") or Path.home() / (".netrc" if os.name != "nt" else "_netrc"))
    host = urlsplit(url).netloc
    try:
        creds = netrc.netrc(str(path)).authenticators(host)
    except (OSError, netrc.NetrcParseError):
        return None, ""
    if creds and creds[2]:
        return creds[2], f"the key for {host} in {path}"
    return None, ""


def probe(url: str, key: str | None, timeout: float = PROBE_S) -> tuple[int | None, str]:
    """Ask ``url`` who ``key`` belongs to: (HTTP status, "") or (None, why there was no answer),
    within ``timeout`` seconds whatever the network does (the request runs in a daemon thread:
    name resolution has no timeout of its own)."""
    req = urllib.request.Request(f"{url}/graphql", data=json.dumps({"query": "query { viewer { id } }"}).encode(),
                                 headers={"Content-Type": "application/json", "User-Agent": "grpo-dist"})
    if key:
        req.add_header("Authorization", "Basic " + base64.b64encode(f"api:{key}".encode()).decode())
    host = urlsplit(url).hostname or ""
    # like wandb-core (Go's proxy rule), a loopback server is never reached through a proxy
    handlers = [urllib.request.ProxyHandler({})] if host in ("localhost", "127.0.0.1", "::1") else []
    answer: list[tuple[int | None, str]] = []

    def ask() -> None:
        try:
            with urllib.request.build_opener(*handlers).open(req, timeout=timeout) as r:
                answer.append((r.status, ""))
        except urllib.error.HTTPError as e:
            answer.append((e.code, ""))
        except (urllib.error.URLError, OSError, ValueError) as e:
            why = getattr(e, "reason", None) or e
            answer.append((None, str(getattr(why, "strerror", None) or why) or type(e).__name__))

    t = threading.Thread(target=ask, name="wandb-probe", daemon=True)
    t.start()
    t.join(timeout + 0.5)
    return answer[0] if answer else (None, f"no answer within {timeout:.0f} s")


def wandb_mode(logging_cfg, say: Callable[[str], None] = print) -> str:
    """The W&B mode a run logs in: ``logging.wandb_mode``, except online with the server out of
    reach: offline (said in one line). Raises ConfigError (one line naming the key's source) for
    a missing, malformed or refused key."""
    mode = logging_cfg.wandb_mode
    if mode != "online":
        return mode
    url = base_url()
    key, source = api_key(url)
    token_file = os.environ.get("WANDB_IDENTITY_TOKEN_FILE")  # federated identity: no key to check
    if not key and not token_file:
        raise ConfigError("logging.wandb_mode: online needs a W&B API key, and none is set: export WANDB_API_KEY=<key> "
                          "(or run `wandb login`, which saves it in ~/.netrc); or log offline (logging.wandb_mode: "
                          "offline) and `wandb sync` the run later")
    if key and (why := key_problem(key)):
        where = "https://wandb.ai/authorize" if url == DEFAULT_URL else "your W&B server's user settings"
        raise ConfigError(f"logging.wandb_mode: online, but {source} is not a W&B API key: {why} (copy it again "
                          f"from {where})")
    memo = (url, hashlib.sha256((key or f"token:{token_file}").encode()).hexdigest())
    if memo in _decided:
        return _decided[memo]
    status, why = probe(url, key)
    if status == 401 and key:
        raise ConfigError(f"logging.wandb_mode: online, but W&B at {url} refused the API key from {source} (HTTP 401): "
                          f"`wandb login --relogin` or export the right WANDB_API_KEY")
    if status is not None and (200 <= status < 300 or (status == 401 and not key)):
        _decided[memo] = "online"
    else:
        said = why if status is None else f"HTTP {status}"
        say(f"warning: W&B at {url} cannot be reached ({said}): logging offline instead; the run's W&B files stay "
            f"under output_dir/wandb and the summary prints the `wandb sync` command that uploads them")
        _decided[memo] = "offline"
    return _decided[memo]
