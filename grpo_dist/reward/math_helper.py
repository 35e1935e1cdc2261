"""The math-verify helper process of the ``math`` reward (see :mod:`grpo_dist.reward.math_answer`).

math-verify's timeouts use ``signal.alarm`` (main thread only) and sympy can hang for good on
inputs like ``9^{9^{9^{9}}}``, so parsing and comparing run here, in a child process
(this file run as a script: only the standard library and math-verify are imported there) that
the scoring process talks to over pipes, one JSON line per comparison, and kills (by its handle)
when a comparison outlives its time.
"""

from __future__ import annotations

import atexit
import json
import math
import os
import select
import subprocess
import sys
import threading
import time

__all__ = ["HELPER"]


class _Helper:
    """One helper child process, started on first use: JSON lines in, JSON lines out."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen | None = None
        self.buf = b""
        self.lock = threading.Lock()
        self.restarts = 0

    def _start(self) -> subprocess.Popen:
        if self.proc is None or self.proc.poll() is not None:
            self.proc = subprocess.Popen([sys.executable, os.path.abspath(__file__)],
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0,
                                         env=dict(os.environ, PYTHONUNBUFFERED="1"))
            self.buf = b""
        return self.proc

    def _kill(self) -> None:
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.kill()
            self.proc.wait()
            self.proc = None
            self.restarts += 1

    def _readline(self, deadline: float) -> bytes | None:
        fd = self.proc.stdout.fileno()
        while b"\n" not in self.buf:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                return None
            chunk = os.read(fd, 65536)
            if not chunk:  # the helper exited
                raise RuntimeError("helper exited")
            self.buf += chunk
        line, _, self.buf = self.buf.partition(b"\n")
        return line

    def equal(self, gold: str, pred: str, timeout_s: float, startup_s: float = 60.0) -> bool:
        """Whether math-verify finds ``pred`` equivalent to ``gold``; False past ``timeout_s``
        (plus the helper's start-up the first time). A helper that died is replaced once."""
        request = json.dumps({"gold": gold, "pred": pred, "timeout": timeout_s}).encode() + b"\n"
        with self.lock:
            for attempt in (0, 1):
                fresh = self.proc is None or self.proc.poll() is not None
                proc = self._start()
                try:
                    proc.stdin.write(request)
                    line = self._readline(time.monotonic() + timeout_s + 1.0 + (startup_s if fresh else 0.0))
                except (BrokenPipeError, RuntimeError):
                    self._kill()
                    if attempt or fresh:  # it cannot even start: math-verify missing or broken
                        raise RuntimeError("the math-verify helper process exited (is math-verify "
                                           "installed? pip install math-verify==0.9.0)") from None
                    continue
                if line is None:  # this comparison outlived its time: the helper may be stuck in sympy
                    self._kill()
                    return False
                return bool(json.loads(line)["ok"])
        return False

    def close(self) -> None:
        """Stop the helper (it exits at the end of its input; killed if busy)."""
        with self.lock:
            if self.proc is not None and self.proc.poll() is None:
                self.proc.stdin.close()
                try:
                    self.proc.wait(timeout=2)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait()
            self.proc = None


HELPER = _Helper()
atexit.register(HELPER.close)


def _die_with_parent() -> None:  # pragma: no cover - Linux only, best effort
    """SIGKILL this helper when its parent dies, even while sympy is stuck."""
    try:
        import ctypes
        import signal

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except Exception:
        pass


def _serve() -> None:  # pragma: no cover - runs in the helper process
    """The helper's loop: one request per line, one ``{"ok": bool}`` per line."""
    import functools
    import logging

    _die_with_parent()
    from math_verify import parse, verify

    logging.getLogger("math_verify").setLevel(logging.CRITICAL)

    @functools.lru_cache(maxsize=4096)
    def parsed(s: str, t: int):
        return parse(s, parsing_timeout=t)

    out, sys.stdout = sys.stdout, sys.stderr  # stray prints (sympy, antlr) must not break the protocol
    for line in sys.stdin:
        req = json.loads(line)
        t = max(1, math.ceil(float(req["timeout"]) / 3))  # parse gold, parse pred, verify
        try:
            gold, pred = parsed(req["gold"], t), parsed(req["pred"], t)
            ok = bool(gold) and bool(pred) and bool(verify(gold, pred, timeout_seconds=t))
        except BaseException:  # noqa: BLE001 - a failed comparison is a wrong answer
            ok = False
        out.write(json.dumps({"ok": ok}) + "\n")
        out.flush()


if __name__ == "__main__":  # pragma: no cover
    _serve()
