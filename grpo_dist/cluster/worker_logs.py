"""Where what the actors print goes (vLLM, Ray, DeepSpeed and transformers warnings, progress bars:
about 20 lines a run, more per engine): a log file in ``output_dir`` by default, the console with
``logging.verbose`` (``grpo-dist train --verbose``). Never with ANSI colour codes unless the console
is a terminal.

Ray sends every line an actor prints to the driver (``log_to_driver``) through one dispatcher; its
own handler (``ray_print_logs``: coloured ``(Actor pid=N)`` prefixes, deduplication) is replaced
by :class:`WorkerLogs` while the driver is connected. The driver's own Python warnings go to the
same file when quiet.

A full or read-only disk never raises here (this runs in Ray's dispatcher thread and at
shutdown): lines that cannot be written are dropped, and the run's own outputs in the same
directory report the disk (``util/disk.py``).
"""

from __future__ import annotations

import logging
import os
import re
import sys
import threading
import time
from pathlib import Path
from typing import Any, TextIO

from grpo_dist.util.disk import writing

ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")
_NAME = "grpo_dist_worker_logs"
_current: "WorkerLogs | None" = None


def strip_ansi(text: str) -> str:
    return ANSI.sub("", text)


class WorkerLogs:
    """A dispatcher handler: each line of an actor as ``(Actor pid=N[, ip=X]) line``, appended to
    ``path`` (quiet), or printed to stdout/stderr (verbose; colours stripped unless a terminal)."""

    def __init__(self, path: Path | None):
        self.path = path
        self.file: TextIO | None = None
        self.lock = threading.Lock()
        self.failed: OSError | None = None  # the first write that failed (lines are dropped from then on)
        if path is not None:
            with writing(path):
                path.parent.mkdir(parents=True, exist_ok=True)
                self.file = open(path, "a", buffering=1, encoding="utf-8", errors="replace")
                self.file.write(f"=== {time.strftime('%Y-%m-%d %H:%M:%S')} pid {os.getpid()}: worker and library "
                                f"logs of this run (grpo-dist train --verbose prints them on the console) ===\n")

    def __call__(self, data: dict[str, Any]) -> None:
        pid = data.get("pid")
        if pid in ("autoscaler", "raylet"):
            prefix = f"({pid}) "
        else:
            name = data.get("actor_name") or data.get("task_name") or ""
            ip = data.get("ip")
            where = "" if ip == data.get("localhost") else f", ip={ip}"
            prefix = f"({name + ' ' if name else ''}pid={pid}{where}) "
        lines = [prefix + line for line in data.get("lines", []) if "__ray_tqdm_magic_token__" not in line]
        if not lines:
            return
        with self.lock:
            if self.failed is not None:
                return
            if self.file is not None:
                self.write("".join(strip_ansi(ln) + "\n" for ln in lines))
                return
            sink = sys.stderr if data.get("is_err") else sys.stdout
            colour = getattr(sink, "isatty", lambda: False)()
            sink.write("".join((ln if colour else strip_ansi(ln)) + "\n" for ln in lines))
            sink.flush()

    def write(self, text: str) -> None:
        """Append to the file; a failed write (full or read-only disk) drops this and every later line."""
        if self.failed is not None or self.file is None:
            return
        try:
            self.file.write(text)
        except OSError as e:
            self.failed = e

    def flush(self) -> None:
        if self.failed is None and self.file is not None:
            try:
                self.file.flush()
            except OSError as e:
                self.failed = e

    def close(self) -> None:
        if self.file is not None:
            file, self.file = self.file, None
            try:
                file.close()
            except OSError as e:  # the last buffered line on a full disk
                self.failed = self.failed or e


class _QuietHandler(logging.StreamHandler):
    """The driver's warnings into the log file; a failed write drops the record (logging's
    default prints a traceback per record)."""

    def handleError(self, record: logging.LogRecord) -> None:
        pass


def route(path: Path | None) -> None:
    """Actors' output to ``path`` (None: the console), in place of Ray's printer; the driver's
    Python warnings to ``path`` too. Call after ``ray.init``; :func:`unroute` before shutdown."""
    global _current
    from ray._private.ray_logging import global_worker_stdstream_dispatcher as dispatcher

    unroute()
    dispatcher.remove_handler("ray_print_logs")
    _current = WorkerLogs(path)
    dispatcher.add_handler(_NAME, _current)
    if path is not None:
        logging.captureWarnings(True)
        handler = _QuietHandler(_current)  # writes through WorkerLogs.write
        handler.set_name(_NAME)
        handler.setFormatter(logging.Formatter("(driver) %(message)s"))
        warn = logging.getLogger("py.warnings")
        warn.addHandler(handler)
        warn.propagate = False


def unroute() -> None:
    global _current
    if _current is None:
        return
    from ray._private.ray_logging import global_worker_stdstream_dispatcher as dispatcher

    dispatcher.remove_handler(_NAME)
    warn = logging.getLogger("py.warnings")
    for h in [h for h in warn.handlers if h.get_name() == _NAME]:
        warn.removeHandler(h)
    if not warn.handlers:
        warn.propagate = True
        logging.captureWarnings(False)
    _current.close()
    _current = None
