"""Scores completions with the configured reward functions, robust to failing functions.

:class:`RewardWorker` is a plain class (the driver wraps it with ``ray.remote``). It resolves
every function when constructed, so a bad plug-in or option fails before training starts.

Reward functions are called as TRL calls them (``fn(prompts=..., completions=..., **kwargs)``,
see ``registry.call_reward``): ``kwargs`` holds every dataset column under its own name,
``completion_ids`` and ``trainer_state`` (:class:`~grpo_dist.types.RewardState`). With a chat
template (``data.chat_template``), ``prompts[i]`` is the conversation the model was given and
``completions[i]`` is ``[{"role": "assistant", "content": text}]``; otherwise both are strings.
Plain functions run one after another, each in its own thread (``reward/calls.py``); the
``async def`` ones run concurrently on an event loop, while the plain ones run.

House rule: a failing reward function does not take the run down, and never fails silently:

* an exception, a timeout (``cfg.timeout_s`` per call) or a result of the wrong length/type ->
  every completion of the batch gets ``cfg.failure_reward`` for that function;
* a non-numeric, NaN or infinite element -> that completion gets ``cfg.failure_reward``;
* a ``None`` element is TRL's "not applicable": it stays None in ``per_function`` and is left
  out of the total. It is not a failure here; the driver counts a function that returns None
  for every completion of a step as failing that step (``reward/failures.py``).

The total is the weighted sum of the applicable values:
``total[i] = sum(weight_f * v_f[i] for every function f whose v_f[i] is not None)``, a failed
value counting as ``failure_reward``; 0.0 when every function returned None for completion i
(TRL's ``nansum``; logged).

Failures are counted in ``RewardResult.errors[name]`` (completions affected), explained in
``RewardResult.reasons[name]`` (one line) and logged as one warning per function and batch on
the ``grpo_dist.reward`` logger, with the traceback (or, for a timeout, the stuck call's stack)
the first time a function fails.
"""

from __future__ import annotations

import copy
import logging
import math
import numbers
import time
import traceback
from typing import Any

from grpo_dist.config import RewardConfig
from grpo_dist.reward.calls import Caller, Failure
from grpo_dist.reward.registry import NamedReward, build_reward_fns
from grpo_dist.types import PROMPT_MESSAGES, RewardResult, RewardState

__all__ = ["RewardWorker", "score_inputs"]

logger = logging.getLogger("grpo_dist.reward")
STATE = "trainer_state"  # the one argument that is not a column (one value for the batch)


def score_inputs(rollouts: list) -> tuple[list, list, dict[str, Any]]:
    """``RewardWorker.score``'s prompts, completions and columns for a list of ``Rollout``s: the
    dataset columns and ``completion_ids`` (one value per completion) and ``trainer_state``.
    Conversational (TRL) prompts and completions where a chat template rendered the prompt."""
    keys = sorted({k for r in rollouts for k in r.columns} - {PROMPT_MESSAGES})
    cols: dict[str, Any] = {k: [r.columns.get(k) for r in rollouts] for k in keys}
    cols["completion_ids"] = [r.completion_ids for r in rollouts]
    if rollouts:
        cols[STATE] = RewardState(global_step=max(max(r.token_versions or [r.adapter_version]) for r in rollouts))
    if rollouts and all(PROMPT_MESSAGES in r.columns for r in rollouts):
        prompts = [r.columns[PROMPT_MESSAGES] for r in rollouts]
        return prompts, [[{"role": "assistant", "content": r.completion}] for r in rollouts], cols
    return [r.prompt for r in rollouts], [r.completion for r in rollouts], cols


class RewardWorker:
    """Holds the resolved reward functions of ``cfg`` and scores flat lists of completions;
    ``adapters`` (several adapters, issue 53): each adapter's reward section, its functions chosen
    by the calls' ``adapter=NAME``."""

    def __init__(self, cfg: RewardConfig, adapters: dict[str, RewardConfig] | None = None):
        self.cfg = cfg
        self.functions: list[NamedReward] = build_reward_fns(cfg.functions)
        self._by_adapter = {name: build_reward_fns(c.functions) for name, c in (adapters or {}).items()}
        self.caller = Caller(cfg.timeout_s)
        self._traced: set[str] = set()
        self._new_tracebacks: dict[str, str] = {}  # first tracebacks found by the current score call

    def score_group(self, generated: tuple, functions: list[str] | None = None,
                    adapter: str | None = None) -> tuple[RewardResult, float]:
        """One group as the streaming pipeline hands it over (``(RolloutGroup, finish time)``,
        straight from the rollout actor): its scores and the wall time they were ready."""
        return self.score(*score_inputs(generated[0].rollouts), functions=functions, adapter=adapter), time.time()

    def _functions(self, adapter: str | None) -> list[NamedReward]:
        if adapter is None:
            return self.functions
        if adapter not in self._by_adapter:
            raise KeyError(f"reward worker: no adapter {adapter!r} (it holds {sorted(self._by_adapter)})")
        return self._by_adapter[adapter]

    def names(self, adapter: str | None = None) -> list[str]:
        """Function names in config order (the keys of ``per_function`` and ``errors``)."""
        return [f.name for f in self._functions(adapter)]

    def score(self, prompts: list[Any], completions: list[Any],
              columns: dict[str, Any] | None = None, functions: list[str] | None = None,
              adapter: str | None = None) -> RewardResult:
        """Score ``completions[i]`` (answering ``prompts[i]``); ``columns`` holds dataset columns,
        one value per completion, passed to every function as keyword arguments, and optionally
        ``trainer_state`` (one object). ``functions``: only these names (evaluation skips the
        rewards whose columns the eval set lacks).

        ``total[i]`` is the weighted sum of the values that are not None (module doc). Raises
        ``ValueError`` only for a malformed call (length mismatches), never because a reward
        function misbehaved.
        """
        n = len(completions)
        if len(prompts) != n:
            raise ValueError(f"{len(prompts)} prompts for {n} completions")
        columns = dict(columns or {})
        extra = {STATE: columns.pop(STATE)} if STATE in columns else {}
        for key, col in columns.items():
            if not isinstance(col, (list, tuple)) or len(col) != n:
                got = len(col) if isinstance(col, (list, tuple)) else type(col).__name__
                raise ValueError(f"column {key!r} must be a list of {n} values, got {got}")
        chosen = [f for f in self._functions(adapter) if functions is None or f.name in functions]
        self._new_tracebacks = {}

        def call(fn: NamedReward):  # copies: an abandoned or careless function cannot mutate the caller's lists
            p, c, cols = copy.deepcopy(prompts), copy.deepcopy(completions), {k: list(v) for k, v in columns.items()}
            return lambda: fn(p, c, **cols, **extra)

        started = {f.name: self.caller.start(call(f)) for f in chosen if f.is_async and n}  # all at once
        per_function: dict[str, list[float | None]] = {}
        errors: dict[str, int] = {}
        reasons: dict[str, str] = {}
        for fn in chosen:
            if not n:
                per_function[fn.name], errors[fn.name] = [], 0
                continue
            try:
                raw = self.caller.wait(started[fn.name]) if fn.name in started else self.caller.call(fn.name, call(fn))
                values, bad, why = _coerce(raw, n, float(self.cfg.failure_reward))
            except Failure as f:
                self._report(fn.name, f"failed on the whole batch of {n}: {f.reason}", f.exc, f.detail)
                values, bad, why = [float(self.cfg.failure_reward)] * n, n, f.reason
            else:
                if bad:
                    why = f"returned {why} for {bad} of {n} completions"
                    self._report(fn.name, why)
                elif values and all(v is None for v in values):
                    logger.warning("reward function %r returned None (not applicable) for all %d completions", fn.name, n)
            per_function[fn.name], errors[fn.name] = values, bad
            if bad:
                reasons[fn.name] = why
        total = [0.0] * n
        for fn in chosen:
            for i, v in enumerate(per_function[fn.name]):
                if v is not None:
                    total[i] += fn.weight * v
        if chosen and n:
            unscored = sum(all(per_function[f.name][i] is None for f in chosen) for i in range(n))
            if unscored:
                logger.warning("every reward function returned None for %d of %d completions: their total is 0.0",
                               unscored, n)
        return RewardResult(total=total, per_function=per_function, errors=errors,
                            tracebacks=self._new_tracebacks, reasons=reasons)

    # ------------------------------------------------------------------------------------------

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
            self._new_tracebacks[name] = f"Stack of the call:\n{detail.rstrip()}"
        else:
            logger.warning(msg)


def _coerce(raw: Any, n: int, fail: float) -> tuple[list[float | None], int, str]:
    """``raw`` as ``n`` floats or None: (values, count of bad elements, what was bad). Raises
    :class:`~grpo_dist.reward.calls.Failure` when ``raw`` is not a sequence of ``n`` elements."""
    if hasattr(raw, "tolist") and not isinstance(raw, (list, tuple)):  # numpy / torch
        try:
            raw = raw.tolist()
        except Exception:
            pass
    if raw is None or isinstance(raw, (str, bytes, dict)) or not hasattr(raw, "__len__"):
        raise Failure(f"returned {type(raw).__name__}, expected a list of {n} floats")
    if len(raw) != n:
        raise Failure(f"returned {len(raw)} values for {n} completions")
    values: list[float | None] = []
    bad, kinds = 0, set()
    for v in raw:
        if v is None:  # TRL: "not applicable" to this completion
            values.append(None)
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
