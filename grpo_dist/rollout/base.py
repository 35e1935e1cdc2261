"""The generator interface every rollout backend implements (vLLM CPU/GPU, transformers).

A backend turns prompt token ids into G sampled completions each, with per-token behaviour
log-probs of the *processed* distribution (temperature applied), so that the learner's
``log_softmax(logits / T)`` is directly comparable. It serves the base model (version 0) or a
LoRA adapter directory (version >= 1), or reloads full weights (``lora.enabled: false``).
"""

from __future__ import annotations

import abc
import contextlib
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, Iterator, Optional


@dataclass
class SamplingSpec:
    n: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    max_tokens: int = 16
    stop: list[str] = field(default_factory=list)
    seed: int | None = None

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


@dataclass
class Sample:
    token_ids: list[int]
    text: str
    logprobs: list[float]
    finish_reason: str  # "stop" | "length" | "abort" (the engine aborted the request)
    versions: list[int] | None = None  # the weight version of each token (in-flight loads); None: one version


class EngineProgress:
    """Whether an engine's calls make progress: engine calls in flight, and when the engine last
    moved. The rollout worker's heartbeat reports :meth:`stalled_s`, and the driver counts a call
    stalled past ``cluster.heartbeat_timeout_s`` as hung, whatever the heartbeat itself says (an
    engine stuck inside a call while its process answers).

    The engine moves when a call begins or ends, when a step of it finishes (``tick``) and, since
    one step can outlast the timeout (a long prefill on shared CPU cores, which CPU engines never
    split), whenever its threads or processes used CPU time since it last moved, at least
    ``MIN_CPU_SHARE`` of a core on average (looked at by each :meth:`stalled_s`): a stopped engine
    (SIGSTOP) or a blocked one (a deadlock) uses none, a helper thread's rare wake-up too little.
    Where the engine works, as the engine declares it: ``threads`` (native ids: an in-process engine's
    own thread), ``processes`` (its engine core and workers), ``runs_on_caller`` (the thread
    inside :meth:`call` does the work: transformers). Judged only inside a call (an idle vLLM
    worker busy-polls), from the call's start where that CPU can be read, else (no ``/proc``, an
    engine that declares nothing) from the call's first tick: one that cannot say it moves is
    never reported stalled. Read from the heartbeat's thread: ``tick`` is plain stores, the rest
    under a lock. ``clock`` and ``cpu`` (a reading ``{source: seconds}``) are for tests."""

    MIN_CPU_SHARE = 0.01  # a busy engine starved by nice-0 work on its cores still gets more (nice 15: ~2%)

    def __init__(self, clock: Callable[[], float] = time.monotonic,
                 cpu: Optional[Callable[[], dict]] = None) -> None:
        self.clock, self._cpu = clock, cpu
        self.calls, self.last, self.moves = 0, clock(), False  # moves: ticked in the calls in flight
        self.threads: set[int] = set()
        self.processes: set[int] = set()
        self.runs_on_caller = False
        self._callers: Counter = Counter()  # native ids of the threads inside a call
        self._seen: dict = {}  # the engine's CPU seconds per source when it last moved, during calls
        self._lock = threading.Lock()

    def tick(self) -> None:
        self.last = self.clock()
        self.moves = self.moves or self.calls > 0

    def cpu_s(self) -> dict:
        """CPU seconds of each thread and process the engine works on ({}: unknown)."""
        if self._cpu is not None:
            return self._cpu()
        from grpo_dist.util.proc_health import cpu_seconds

        threads = (self.threads | set(self._callers)) if self.runs_on_caller else self.threads
        return cpu_seconds(threads, self.processes)

    def stalled_s(self) -> float:
        """Seconds since the engine last moved while a call is in flight (0 when idle)."""
        with self._lock:
            if self.calls == 0:
                return 0.0
            now, cpu = self.clock(), self.cpu_s()
            used = sum(v - self._seen[k] for k, v in cpu.items() if k in self._seen)
            if used > 0 and used >= self.MIN_CPU_SHARE * (now - self.last):
                self.last, self._seen = now, {**self._seen, **cpu}  # it computes
            return max(0.0, now - self.last) if self.moves or self._seen else 0.0

    @contextlib.contextmanager
    def call(self) -> Iterator[None]:
        tid = threading.get_native_id()
        with self._lock:
            if self.calls == 0:  # judged afresh: CPU from now on, ticks of these calls
                self.moves, self._seen = False, {}
            self.calls += 1
            self._callers[tid] += 1
            self._seen = {**self.cpu_s(), **self._seen}  # where this call's thread starts from
            self.last = self.clock()
        try:
            yield
        finally:
            with self._lock:
                self.calls -= 1
                self._callers[tid] -= 1
                if self._callers[tid] <= 0:
                    del self._callers[tid]
                    if tid not in self.threads:
                        self._seen.pop(("thread", tid), None)
                self.last = self.clock()


def progress_of(engine: "Generator") -> EngineProgress:
    """The engine's :class:`EngineProgress` (made on first use)."""
    p = engine.__dict__.get("progress")
    if p is None:
        p = engine.__dict__["progress"] = EngineProgress()
    return p


class Generator(abc.ABC):
    """One inference engine. Not thread-safe; one per rollout actor. Engines that can say so tick
    ``progress_of(self)`` after each step of a call (vLLM's engine step, a transformers decode
    step) and declare where they compute (its ``threads``, ``processes``, ``runs_on_caller``);
    callers wrap each call in ``progress_of(engine).call()``."""

    @abc.abstractmethod
    def generate(self, prompt_ids: list[list[int]], spec: SamplingSpec,
                 seeds: list[list[int]] | None = None) -> list[list[Sample]]:
        """For each prompt, ``spec.n`` samples (in order). Greedy when temperature == 0.

        ``seeds[i][j]``: the seed of sample j of prompt i, which then depends on nothing else
        (batch, order, other requests); None: the engine's own random stream."""

    @abc.abstractmethod
    def set_adapter(self, version: int, path: str | None) -> None:
        """Serve LoRA adapter ``path`` as ``version`` from now on (None: the base model)."""

    @abc.abstractmethod
    def load_full_weights(self, path: str) -> None:
        """Reload all model weights from a safetensors directory (full fine-tuning sync)."""

    loads_in_memory = False  # load_state works (else weights reach the engine as a directory)

    def load_state(self, tensors) -> None:
        """Load ``(name, tensor)`` pairs in place, taken one at a time (engines with
        ``loads_in_memory``: no file written and read back)."""
        raise NotImplementedError(f"{type(self).__name__} loads weights from a directory only")

    tokenizer = None  # a transformers tokenizer, set by the backend

    def tokenize(self, texts: list[str], add_special_tokens: bool = True) -> list[list[int]]:
        """Prompt ids exactly as the learner will see them (the Rollout carries these ids)."""
        return [self.tokenizer(t, add_special_tokens=add_special_tokens)["input_ids"] for t in texts]

    def close(self) -> None:  # pragma: no cover - backends override when they hold resources
        pass


def generate_each(engine: Generator, prompt_ids: list[list[int]], specs: list[SamplingSpec],
                  seeds: list[int | None]) -> list[Sample]:
    """One sample per request (``prompt_ids[i]`` sampled under ``specs[i]`` with seed ``seeds[i]``),
    as few engine calls as the requests allow: one per distinct sampling (token limit,
    temperature, top-p, top-k, stop strings), seeded per request when every request of that call
    has a seed. The one batching of the multi-turn loop and of user rollout functions."""
    calls: dict[tuple, list[int]] = {}
    for i, s in enumerate(specs):
        calls.setdefault((s.max_tokens, s.temperature, s.top_p, s.top_k, tuple(s.stop)), []).append(i)
    out: list[Sample | None] = [None] * len(specs)
    for idx in calls.values():
        spec = specs[idx[0]]
        call_seeds = None if any(seeds[i] is None for i in idx) else [[seeds[i]] for i in idx]
        with progress_of(engine).call():
            samples = engine.generate([prompt_ids[i] for i in idx], spec, seeds=call_seeds)
        for i, (s,) in zip(idx, samples):
            out[i] = s
    return out  # type: ignore[return-value]
