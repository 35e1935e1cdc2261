"""Another program on the machine against an agent endpoint (issue 41): it knows the endpoint's
port (any local user lists listening ports with ``ss -ltn``) but no trajectory's secret, and tries
every route with guessed trajectory ids: 1..50, random strings, and near misses of a secret when
it is given one. Standard library only, so it runs as a second OS process:

    python tests/agent_attacker.py PORT PAYLOAD  ->  one JSON list on stdout

Each attempt: ``[method, path, status, body, headers]`` (status None when the connection failed
or timed out: a request that hangs is not a refusal). Every POST carries ``PAYLOAD`` as its
prompt, so a run's batch can be searched for it.
"""

from __future__ import annotations

import json
import secrets
import sys
import urllib.error
import urllib.request

NEVER = "never-handed-out-0123456789abcdefghijk"  # a secret no endpoint issued: the answer every guess must get
ROUTES = [("GET", "models"), ("POST", "chat/completions"), ("POST", "completions"), ("GET", "chat/completions"),
          ("POST", "models"), ("POST", "embeddings"), ("DELETE", "models"), ("OPTIONS", "chat/completions")]
ROOTS = ["/", "/health", "/healthz", "/v1/models", "/models", "/v1/chat/completions", "/v1/completions", "/t",
         "/t/", "/t/v1/models", "/metrics", "/docs", "/openapi.json", "/version", "/ping"]


def guesses(near: str | None = None) -> list[str]:
    """Trajectory ids to try: sequential ones, random ones, odd ones, and near misses of ``near``."""
    out = [NEVER] + [str(i) for i in range(0, 51)] + [secrets.token_urlsafe(24) for _ in range(4)]
    out += ["-1", "01", "a" * 32, "1%2Fv1", "%31", "..%2F1", "*", "None", "null", "%00"]
    if near:
        flip = near[:-1] + ("A" if near[-1] != "A" else "B")
        out += [flip, near[:-1], near + "x", near.swapcase(), near[:16], near[1:], near[::-1], near.upper()]
    return out


def attempts(near: str | None = None) -> list[tuple[str, str]]:
    out = []
    for g in guesses(near):
        out += [(m, f"/t/{g}/v1/{r}") for m, r in ROUTES]
        out += [("GET", f"/t/{g}"), ("GET", f"/t/{g}/v1"), ("GET", f"/t/{g}/v1/"), ("POST", f"/t/{g}/v1/models/")]
    for root in ROOTS:
        out += [("GET", root), ("POST", root), ("HEAD", root)]
    return out


def body_for(path: str, payload: str) -> bytes:
    if path.endswith("/completions") and not path.endswith("chat/completions"):
        return json.dumps({"model": "policy", "prompt": payload, "max_tokens": 4}).encode()
    return json.dumps({"model": "policy", "max_tokens": 4,
                       "messages": [{"role": "user", "content": payload}]}).encode()


def attempt(port: int, method: str, path: str, payload: str, timeout: float = 3.0) -> list:
    data = body_for(path, payload) if method == "POST" else None
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data, method=method,
                                 headers={"Content-Type": "application/json", "Authorization": "Bearer sk-guess"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return [method, path, r.status, r.read().decode("utf-8", "replace"), dict(r.headers)]
    except urllib.error.HTTPError as e:
        return [method, path, e.code, e.read().decode("utf-8", "replace"), dict(e.headers)]
    except OSError as e:  # refused, reset, timed out: not an answer
        return [method, path, None, repr(e), {}]


def same_answer(a: list, b: list) -> bool:
    """Two attempts got the same answer: status, body and headers apart from date and length (a
    HEAD request's empty body aside)."""
    def strip(h: dict) -> dict:
        return {k.lower(): v for k, v in h.items() if k.lower() not in ("date", "content-length")}

    return a[2] == b[2] and (a[3] == b[3] or "HEAD" in (a[0], b[0])) and strip(a[4]) == strip(b[4])


def not_refused(results: list[list], never: list) -> list[list]:
    """The attempts whose answer differs from ``never``'s (a secret that was never handed out)."""
    return [r for r in results if not same_answer(r, never)]


def attack(port: int, payload: str, near: str | None = None, timeout: float = 3.0) -> list[list]:
    return [attempt(port, m, p, payload, timeout) for m, p in attempts(near)]


if __name__ == "__main__":
    json.dump(attack(int(sys.argv[1]), sys.argv[2]), sys.stdout)
