"""Calling one reward function with a timeout: a plain function in its own daemon thread, an
``async def`` one on the worker's event loop, all of a batch's async calls at once (as TRL does).

A Python thread cannot be killed: a timed-out plain call is abandoned and keeps running in the
background (a daemon thread, so it never blocks interpreter exit). While it is still running,
later calls of that function are not started, they fail at once, so hung calls cannot pile up.
A timed-out coroutine is cancelled. A coroutine that blocks the event loop (a blocking call
inside ``async def``) makes every async call of the batch time out; the loop is then abandoned
and the next batch gets a new one.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import io
import sys
import threading
import time
import traceback
from typing import Any, Callable

__all__ = ["Caller", "Failure"]

_GRACE_S = 2.0  # how long past timeout_s the driver side waits for a cancelled coroutine


class Failure(Exception):
    """One function's whole-batch failure: ``reason`` (one line), ``exc`` or ``detail`` (a stack)
    for the first report."""

    def __init__(self, reason: str, exc: BaseException | None = None, detail: str | None = None):
        super().__init__(reason)
        self.reason, self.exc, self.detail = reason, exc, detail


def exception_reason(e: BaseException) -> str:
    """``"RuntimeError: reward server down"``: the type and the first line of the message."""
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0][:300]}" if text else type(e).__name__


class Caller:
    """Runs reward calls for one worker with ``timeout_s`` each."""

    def __init__(self, timeout_s: float):
        self.timeout = float(timeout_s)
        self._abandoned: dict[str, threading.Thread] = {}
        self._loop: asyncio.AbstractEventLoop | None = None

    # -- plain functions -------------------------------------------------------------------
    def call(self, name: str, call: Callable[[], Any]) -> Any:
        """``call()`` in a daemon thread, waited on for ``timeout_s``; raises :class:`Failure`."""
        old = self._abandoned.get(name)
        if old is not None:
            if old.is_alive():
                raise Failure("its previous call timed out and is still running; not called again yet")
            del self._abandoned[name]
        box: dict[str, Any] = {}

        def target() -> None:
            try:
                box["value"] = call()
            except BaseException as e:  # noqa: BLE001 - reported, never re-raised
                box["error"] = e

        thread = threading.Thread(target=target, name=f"reward-{name}", daemon=True)
        start = time.monotonic()
        thread.start()
        thread.join(self.timeout)
        if thread.is_alive():
            self._abandoned[name] = thread
            frame = sys._current_frames().get(thread.ident or -1)
            stack = "".join(traceback.format_stack(frame)) if frame is not None else None
            raise Failure(f"timed out after {time.monotonic() - start:.2f}s (reward.timeout_s {self.timeout:g}); "
                          f"the call is abandoned", detail=stack)
        if "error" in box:
            raise Failure(exception_reason(box["error"]), exc=box["error"])
        return box.get("value")

    # -- async def functions ---------------------------------------------------------------
    def start(self, call: Callable[[], Any]) -> tuple[concurrent.futures.Future, float]:
        """Schedule the coroutine ``call()`` returns on the event loop; collect it with :meth:`wait`."""
        loop = self._event_loop()
        return asyncio.run_coroutine_threadsafe(self._guarded(call, self.timeout), loop), time.monotonic()

    def wait(self, started: tuple[concurrent.futures.Future, float]) -> Any:
        """The result of a :meth:`start`-ed call; raises :class:`Failure`."""
        fut, t0 = started
        try:
            return fut.result(timeout=max(0.0, t0 + self.timeout + _GRACE_S - time.monotonic()))
        except Failure:
            raise
        except concurrent.futures.TimeoutError:
            self._loop = None  # blocked by a coroutine that never yields: the next batch gets a new loop
            raise Failure(f"timed out after {time.monotonic() - t0:.2f}s (reward.timeout_s {self.timeout:g}); it "
                          f"blocked the event loop (a blocking call inside async def?)") from None
        except BaseException as e:  # noqa: BLE001 - the coroutine's own exception
            raise Failure(exception_reason(e), exc=e) from None

    def _event_loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            loop = asyncio.new_event_loop()
            threading.Thread(target=loop.run_forever, name="reward-async", daemon=True).start()
            self._loop = loop
        return self._loop

    @staticmethod
    async def _guarded(call: Callable[[], Any], timeout: float) -> Any:
        t0 = time.monotonic()
        task = asyncio.ensure_future(call())
        done, _ = await asyncio.wait({task}, timeout=timeout)
        if done:
            return task.result()
        buf = io.StringIO()
        task.print_stack(file=buf)
        task.cancel()
        raise Failure(f"timed out after {time.monotonic() - t0:.2f}s (reward.timeout_s {timeout:g}); the call is "
                      f"cancelled", detail=buf.getvalue())
