"""One thread that owns an object: every call made through it runs there, whoever asks.

For state that belongs to a thread rather than a process: a vLLM CPU engine in this process
binds the OpenMP team of the thread that built it, and its attention kernels compare the thread
count they were planned with against the calling thread's (OpenMP's thread count is per thread);
called from another thread, the first small batch fails that check and leaves the engine stuck
(grpo_dist/rollout/vllm_engine.py).
"""

from __future__ import annotations

import queue
import threading
from concurrent.futures import Future
from typing import Any, Callable


class OwnerThread:
    """A daemon thread running the calls given to :meth:`call`, one at a time, in order (a hung
    call does not hold back the process's exit)."""

    def __init__(self, name: str):
        self._calls: queue.SimpleQueue = queue.SimpleQueue()
        self._stopped = False
        self._thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            item = self._calls.get()
            if item is None:
                return
            fn, args, kwargs, fut = item
            try:
                fut.set_result(fn(*args, **kwargs))
            except BaseException as e:  # noqa: BLE001 - the caller's to handle, in its thread
                fut.set_exception(e)

    @property
    def native_id(self) -> int:
        """The thread's id in the kernel (``/proc/self/task/<id>``: the CPU time it used)."""
        return self._thread.native_id

    def owns_this(self) -> bool:
        return threading.current_thread() is self._thread

    def call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """``fn(*args, **kwargs)`` run on the owner thread (directly when called from it): its
        result, or its exception raised here."""
        if self.owns_this():
            return fn(*args, **kwargs)
        if self._stopped or not self._thread.is_alive():
            raise RuntimeError(f"thread {self._thread.name!r} has stopped")
        fut: Future = Future()
        self._calls.put((fn, args, kwargs, fut))
        return fut.result()

    def stop(self) -> None:
        """End the thread after the calls already given (returns at once); later calls raise."""
        self._stopped = True
        self._calls.put(None)
