"""The generator interface every rollout backend implements (vLLM CPU/GPU, transformers).

A backend turns prompt token ids into G sampled completions each, with per-token behaviour
log-probs of the *processed* distribution (temperature applied), so that the learner's
``log_softmax(logits / T)`` is directly comparable. It serves the base model (version 0) or a
LoRA adapter directory (version >= 1), or reloads full weights (``lora.enabled: false``).
"""

from __future__ import annotations

import abc
import contextlib
import time
from dataclasses import dataclass, field
from typing import Iterator


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
    moved (a call began or ended, a step of the engine finished: ``tick``). The rollout worker's
    heartbeat reports :meth:`stalled_s`, and the driver counts a call stalled past
    ``cluster.heartbeat_timeout_s`` as hung, whatever the heartbeat itself says (an engine stuck
    inside a call while its process answers). An engine that never ticked inside a call (one
    that cannot say it moves) is never reported stalled. Read from the heartbeat's thread: plain
    floats."""

    def __init__(self) -> None:
        self.calls, self.last, self.moves = 0, time.monotonic(), False

    def tick(self) -> None:
        self.last = time.monotonic()
        self.moves = self.moves or self.calls > 0

    def stalled_s(self) -> float:
        """Seconds since the engine last moved while a call is in flight (0 when idle)."""
        return time.monotonic() - self.last if self.calls > 0 and self.moves else 0.0

    @contextlib.contextmanager
    def call(self) -> Iterator[None]:
        self.calls += 1
        self.last = time.monotonic()
        try:
            yield
        finally:
            self.calls -= 1
            self.last = time.monotonic()


def progress_of(engine: "Generator") -> EngineProgress:
    """The engine's :class:`EngineProgress` (made on first use)."""
    p = engine.__dict__.get("progress")
    if p is None:
        p = engine.__dict__["progress"] = EngineProgress()
    return p


class Generator(abc.ABC):
    """One inference engine. Not thread-safe; one per rollout actor. Engines that can say so tick
    ``progress_of(self)`` after each step of a call (vLLM's engine step, a transformers decode
    step); callers wrap each call in ``progress_of(engine).call()``."""

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
