"""Peak memory: a process's extra peak over a block of code (host memory on Linux: the resident
set's high-water mark, reset for the block; or CUDA memory where the tensors live on a GPU), and a
process's whole-life peak resident set with its child processes' (``peak_rss``: what each role
of a run reports in ``summary.json``)."""

from __future__ import annotations

import re
from typing import Optional

_STATUS = "/proc/self/status"
_hwm_before_reset = 0  # this process's VmHWM before a PeakMemory block reset it (the whole-life peak)
_hwm_tracked: Optional[bool] = None  # whether a reset high-water mark follows what is touched (probed once)


def _status_kb(key: str, path: str = _STATUS) -> Optional[int]:
    try:
        with open(path) as f:
            m = re.search(rf"^{key}:\s+(\d+) kB", f.read(), re.M)
    except OSError:
        return None
    return int(m.group(1)) * 1024 if m else None


def _reset_hwm() -> None:
    global _hwm_before_reset
    _hwm_before_reset = max(_hwm_before_reset, _status_kb("VmHWM") or 0)
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def _hwm_follows_touched_pages() -> bool:
    """Once per process: reset the high-water mark, touch 16 MiB, and see the mark rise by most of
    it. Some sandboxes accept the reset but report a mark (and a resident set) that does not follow
    the pages touched (CI's: a block that kept 64 MiB read 0); there every answer is None."""
    global _hwm_tracked
    if _hwm_tracked is None:
        try:
            _reset_hwm()
            before = _status_kb("VmHWM")
            probe = bytearray(16 << 20)
            probe[::4096] = b"x" * len(probe[::4096])
            after = _status_kb("VmHWM")
            del probe
            _hwm_tracked = before is not None and after is not None and after - before >= 12 << 20
        except OSError:
            _hwm_tracked = False
    return _hwm_tracked


class PeakMemory:
    """``with PeakMemory() as p: ...`` then ``p.extra``: the bytes the block added at its peak
    (the peak minus what was in use when it started); ``None`` where nothing measures it.

    Host: ``/proc/self/clear_refs`` "5" resets the process's ``VmHWM`` (Linux >= 4.0), so the
    block's peak resident set is read afterwards. It counts every thread of the process (a Ray
    actor's own threads allocate little). ``cuda``: ``torch.cuda``'s allocator peak instead."""

    def __init__(self, cuda: bool = False):
        self.cuda = cuda
        self.extra: Optional[int] = None
        self._start: Optional[int] = None

    def __enter__(self) -> "PeakMemory":
        if self.cuda:
            import torch

            torch.cuda.reset_peak_memory_stats()
            self._start = torch.cuda.memory_allocated()
            return self
        if not _hwm_follows_touched_pages():
            return self
        try:
            _reset_hwm()
            self._start = _status_kb("VmRSS")
        except OSError:
            self._start = None
        return self

    def __exit__(self, *exc) -> None:
        if self._start is None:
            return
        if self.cuda:
            import torch

            self.extra = max(0, torch.cuda.max_memory_allocated() - self._start)
            return
        peak, now = _status_kb("VmHWM"), _status_kb("VmRSS")
        if peak is None or now is None or peak + (1 << 20) < now:
            self.extra = None  # a high-water mark below the current resident set is not kept (sandboxes)
            return
        self.extra = max(0, peak - self._start)


class TensorPeak:
    """``with TensorPeak() as p: ...`` then ``p.extra``: the peak of the tensor bytes the block
    allocated and had not yet freed, counted at torch's CPU allocator (torch.profiler's memory
    events). Unlike ``PeakMemory`` it does not depend on the kernel keeping a high-water mark
    (CI's sandbox does not), and it sees only tensors. For tests and benchmarks: the profiler slows
    the block down."""

    def __init__(self):
        self.extra: Optional[int] = None
        self._prof = None

    def __enter__(self) -> "TensorPeak":
        from torch.profiler import ProfilerActivity, profile

        self._prof = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
        self._prof.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._prof.__exit__(*exc)
        events = sorted((e for e in self._prof.profiler.kineto_results.events() if e.name() == "[memory]"),
                        key=lambda e: e.start_ns())
        now = peak = 0
        for e in events:
            now += e.nbytes()
            peak = max(peak, now)
        self.extra = peak if events else None


def peak_rss(children: bool = True) -> dict[str, int]:
    """This process's peak resident set over its life (``self``, bytes; 0 where the kernel does
    not say) and, with ``children``, the sum of its live descendants' (``children``: vLLM's engine
    core and worker processes of a rollout actor). The sum of peaks bounds the peak of the sum."""
    own = max(_hwm_before_reset, _status_kb("VmHWM") or 0)
    kids = 0
    if children:
        import psutil

        try:
            procs = psutil.Process().children(recursive=True)
        except psutil.Error:
            procs = []
        for p in procs:
            kids += _status_kb("VmHWM", f"/proc/{p.pid}/status") or 0
    return {"self": own, "children": kids}
