"""Scores completions with the configured reward functions, robust to failing functions.

:class:`RewardWorker` is a plain class (the driver wraps it with ``ray.remote``). It resolves
every function when constructed, so a bad plug-in or option fails before training starts.

House rule: a failing reward function does not take the run down, and never fails silently.
Each function is called once per batch in its own daemon thread, waited on for
``cfg.timeout_s``:

* an exception, a timeout or a result of the wrong length/type -> every completion of the batch
  gets ``cfg.failure_reward`` for that function;
* a non-numeric, NaN or infinite element -> that completion gets ``cfg.failure_reward``;
* a ``None`` element is TRL's "not applicable": it counts 0.0 and is not an error.

Failures are counted in ``RewardResult.errors[name]`` (completions affected) and logged as one
warning per function and batch on the ``grpo_dist.reward`` logger, with the traceback (or, for a
timeout, the stuck thread's stack) the first time a function fails.

A Python thread cannot be killed: a timed-out call is abandoned and keeps running in the
background (a daemon thread, so it never blocks interpreter exit). While it is still running,
later calls of that function are not started — they fail at once — so hung calls cannot pile up.
Functions run one after another, so a batch takes at most ``len(functions) * timeout_s``.
"""

from __future__ import annotations

import logging
import math
import numbers
import sys
import threading
import time
import traceback
from typing import Any

from grpo_dist.config import RewardConfig
from grpo_dist.reward.registry import NamedReward, build_reward_fns
from grpo_dist.types import RewardResult

__all__ = ["RewardWorker", "score_inputs"]

logger = logging.getLogger("grpo_dist.reward")


class _Failure(Exception):
    """One function's whole-batch failure: ``reason`` for the log, ``detail`` (traceback text) or
    ``exc`` for the first report."""

    def __init__(self, reason: str, exc: BaseException | None = None, detail: str | None = None):
        super().__init__(reason)
        self.reason, self.exc, self.detail = reason, exc, detail


def score_inputs(rollouts: list) -> tuple[list, list, dict[str, list]]:
    """``RewardWorker.score``'s prompts, completions and columns (dataset columns and
    ``completion_ids``, one value per completion) for a list of ``Rollout``s."""
    cols = {k: [r.columns.get(k) for r in rollouts] for k in sorted({k for r in rollouts for k in r.columns})}
    cols["completion_ids"] = [r.completion_ids for r in rollouts]
    return [r.prompt for r in rollouts], [r.completion for r in rollouts], cols


class RewardWorker:
    """Holds the resolved reward functions of ``cfg`` and scores flat lists of completions."""

    def __init__(self, cfg: RewardConfig):
        self.cfg = cfg
        self.functions: list[NamedReward] = build_reward_fns(cfg.functions)
        self._abandoned: dict[str, threading.Thread] = {}
        self._traced: set[str] = set()
        self._new_tracebacks: dict[str, str] = {}  # first tracebacks found by the current score call

    def score_group(self, generated: tuple, functions: list[str] | None = None) -> tuple[RewardResult, float]:
        """One group as the streaming pipeline hands it over (``(RolloutGroup, finish time)``,
        straight from the rollout actor): its scores and the wall time they were ready."""
        return self.score(*score_inputs(generated[0].rollouts), functions=functions), time.time()

    def names(self) -> list[str]:
        """Function names in config order (the keys of ``per_function`` and ``errors``)."""
        return [f.name for f in self.functions]

    def score(self, prompts: list[Any], completions: list[Any],
              columns: dict[str, list] | None = None, functions: list[str] | None = None) -> RewardResult:
        """Score ``completions[i]`` (answering ``prompts[i]``); ``columns`` holds dataset columns,
        one value per completion, passed to every function as keyword arguments. ``functions``:
        only these names (evaluation skips the rewards whose columns the eval set lacks).

        ``total[i] = sum_f weight_f * per_function[f][i]``. Raises ``ValueError`` only for a
        malformed call (length mismatches), never because a reward function misbehaved.
        """
        n = len(completions)
        if len(prompts) != n:
            raise ValueError(f"{len(prompts)} prompts for {n} completions")
        columns = dict(columns or {})
        for key, col in columns.items():
            if not isinstance(col, (list, tuple)) or len(col) != n:
                got = len(col) if isinstance(col, (list, tuple)) else type(col).__name__
                raise ValueError(f"column {key!r} must be a list of {n} values, got {got}")
        per_function: dict[str, list[float]] = {}
        errors: dict[str, int] = {}
        total = [0.0] * n
        self._new_tracebacks: dict[str, str] = {}
        for fn in self.functions:
            if functions is not None and fn.name not in functions:
                continue
            values, bad = self._run_one(fn, prompts, completions, columns) if n else ([], 0)
            per_function[fn.name], errors[fn.name] = values, bad
            for i, v in enumerate(values):
                total[i] += fn.weight * v
        return RewardResult(total=total, per_function=per_function, errors=errors, tracebacks=self._new_tracebacks)

    # ------------------------------------------------------------------------------------------

    def _run_one(self, fn: NamedReward, prompts: list, completions: list,
                 columns: dict[str, list]) -> tuple[list[float], int]:
        n, fail = len(completions), float(self.cfg.failure_reward)
        try:
            raw = self._call(fn, prompts, completions, columns)
            values, bad, why = _coerce(raw, n, fail)
        except _Failure as f:
            self._report(fn.name, f"failed on the whole batch of {n}: {f.reason}", f.exc, f.detail)
            return [fail] * n, n
        if bad:
            self._report(fn.name, f"returned {why} for {bad} of {n} completions")
        return values, bad

    def _call(self, fn: NamedReward, prompts: list, completions: list, columns: dict) -> Any:
        old = self._abandoned.get(fn.name)
        if old is not None:
            if old.is_alive():
                raise _Failure("its previous call timed out and is still running; not called again yet")
            del self._abandoned[fn.name]
        box: dict[str, Any] = {}

        def target() -> None:
            try:  # copies: an abandoned or careless function cannot mutate the caller's lists
                box["value"] = fn(list(prompts), list(completions),
                                  **{k: list(v) for k, v in columns.items()})
            except BaseException as e:  # noqa: BLE001 — reported, never re-raised
                box["error"] = e

        thread = threading.Thread(target=target, name=f"reward-{fn.name}", daemon=True)
        start = time.monotonic()
        thread.start()
        thread.join(self.cfg.timeout_s)
        if thread.is_alive():
            self._abandoned[fn.name] = thread
            frame = sys._current_frames().get(thread.ident or -1)
            stack = "".join(traceback.format_stack(frame)) if frame is not None else None
            raise _Failure(f"timed out after {time.monotonic() - start:.2f}s (timeout_s="
                           f"{self.cfg.timeout_s}); the call is abandoned", detail=stack)
        if "error" in box:
            e = box["error"]
            raise _Failure(f"{type(e).__name__}: {e}", exc=e)
        return box.get("value")

    def _report(self, name: str, message: str, exc: BaseException | None = None,
                detail: str | None = None) -> None:
        msg = f"reward function {name!r} {message}; they get failure_reward={self.cfg.failure_reward}"
        first = name not in self._traced  # the first traceback of each function is logged (and sent)
        if first and exc is not None:
            self._traced.add(name)
            logger.warning(msg, exc_info=exc)
            self._new_tracebacks[name] = "".join(traceback.format_exception(exc))
        elif first and detail:
            self._traced.add(name)
            logger.warning("%s\nStack of the call:\n%s", msg, detail.rstrip())
            self._new_tracebacks[name] = f"{message}\nStack of the call:\n{detail.rstrip()}"
        else:
            logger.warning(msg)


def _coerce(raw: Any, n: int, fail: float) -> tuple[list[float], int, str]:
    """``raw`` as ``n`` floats: (values, count of bad elements, what was bad). Raises
    :class:`_Failure` when ``raw`` is not a sequence of ``n`` elements."""
    if hasattr(raw, "tolist") and not isinstance(raw, (list, tuple)):  # numpy / torch
        try:
            raw = raw.tolist()
        except Exception:
            pass
    if raw is None or isinstance(raw, (str, bytes, dict)) or not hasattr(raw, "__len__"):
        raise _Failure(f"returned {type(raw).__name__}, expected a list of {n} floats")
    if len(raw) != n:
        raise _Failure(f"returned {len(raw)} values for {n} completions")
    values, bad, kinds = [], 0, set()
    for v in raw:
        if v is None:  # TRL: "not applicable" to this completion
            values.append(0.0)
            continue
        if hasattr(v, "item") and not isinstance(v, numbers.Real):
            try:
                v = v.item()
            except Exception:
                pass
        if isinstance(v, numbers.Real):
            x = float(v)
            if math.isfinite(x):
                values.append(x)
                continue
            kinds.add(repr(x))
        else:
            kinds.add(f"non-numeric {type(v).__name__}")
        values.append(fail)
        bad += 1
    return values, bad, ", ".join(sorted(kinds))
