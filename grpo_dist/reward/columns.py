"""Which dataset columns each reward function needs, and which rewards can score a given set of records.

Used on the driver before any actor starts (pre-flight: a reward that needs a column the data lacks
is a config error) and by evaluation (an eval set lacking a column is scored with the rewards that
need none). Imports no torch or Ray.
"""

from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass, field
from typing import Any

from grpo_dist.config import Config, ConfigError
from grpo_dist.reward.builtin import composite_components, composite_reward
from grpo_dist.reward.registry import build_reward_fns, registered_options

# what the pipeline itself passes with every completion (reward.worker.score_inputs), never from the data
PIPELINE_COLUMNS = frozenset({"completion_ids", "trainer_state"})


def check_rewards(cfg: Config) -> dict[str, tuple[Any, set[str]]]:
    """Resolve every reward function as the reward workers will; return name -> (NamedReward,
    required dataset columns)."""
    try:
        fns = build_reward_fns(cfg.reward.functions)
    except ValueError as e:
        raise ConfigError(f"reward.functions: {_first_line(e)}") from None
    out: dict[str, tuple[Any, set[str]]] = {}
    for i, nf in enumerate(fns):
        spec = cfg.reward.functions[i].fn
        out[nf.name] = (nf, required_columns(spec, nf.fn, f"reward.functions[{i}]"))
    return out


def required_columns(spec: str, fn: Any, key: str) -> set[str]:
    """Dataset columns ``fn`` (a functools.partial with the configured options) cannot run
    without; ConfigError when it cannot take completions: it needs a ``completions`` parameter
    (TRL: ``fn(prompts=..., completions=..., **kwargs)``) or two positional ones (``fn(p, c, **kw)``)."""
    inner = fn.func if isinstance(fn, functools.partial) else fn
    bound = set(fn.keywords) if isinstance(fn, functools.partial) else set()
    try:
        params = list(inspect.signature(inner).parameters.values())
    except (TypeError, ValueError):
        return set()  # no signature to inspect (a C callable): trust it
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    by_keyword = any(p.name == "completions" and p.kind is not p.POSITIONAL_ONLY for p in params)
    if not by_keyword and len(positional) < 2 and not any(p.kind is p.VAR_POSITIONAL for p in params):
        raise ConfigError(f"{key}: reward function {spec!r} must accept completions (TRL: fn(prompts, completions, "
                          f"**kwargs)); its signature is {inspect.signature(inner)}")
    if by_keyword:  # called with keywords: every named parameter but these is a column
        rest = [p for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    else:
        rest = positional[2:] + [p for p in params if p.kind is p.KEYWORD_ONLY]
    tail = params if by_keyword else positional[2:]  # what must arrive as a keyword
    bad = [p.name for p in tail if p.kind is p.POSITIONAL_ONLY and p.default is p.empty]
    if bad:
        raise ConfigError(f"{key}: reward function {spec!r} has positional-only parameters {bad}; dataset columns "
                          f"arrive as keyword arguments")
    options = registered_options(inner)
    need = set()
    for p in rest:
        if p.name in bound or p.name in ("prompts", "completions"):
            continue
        if options is not None:  # a registered function: its declared columns without a None default
            if p.name not in options and p.default is not None:
                need.add(p.name)
        elif p.default is p.empty:
            need.add(p.name)
    if inner is composite_reward and "components" in bound:
        for cspec, cfn, _, opts in composite_components(fn.keywords["components"]):
            need |= required_columns(cspec, functools.partial(cfn, **opts), key)
    return need


@dataclass
class EvalPlan:
    """Which configured rewards score this eval set: ``used`` (config order), ``skipped``
    (name -> the columns it needs and the eval set lacks) and ``accuracy`` (the used rewards
    that check a reference column)."""

    used: list[str]
    skipped: dict[str, list[str]] = field(default_factory=dict)
    accuracy: list[str] = field(default_factory=list)

    def describe(self) -> str | None:
        """The log line for an eval set that cannot be scored like training (None if it can)."""
        if self.skipped:
            why = "; ".join(f"{n} needs {', '.join(repr(c) for c in cols)}" for n, cols in self.skipped.items())
            acc = "" if self.accuracy else "; no accuracy or pass@k"
            return (f"evaluation: the eval set lacks columns some rewards need ({why}): scoring with "
                    f"{', '.join(self.used) or 'no reward'} only{acc}")
        if not self.accuracy:
            return (f"evaluation: no configured reward checks a reference answer; reporting the rewards "
                    f"{', '.join(self.used)} (no accuracy or pass@k)")
        return None


def plan_eval(rewards: dict[str, tuple[Any, set[str]]], records: list[Any]) -> EvalPlan:
    """The :class:`EvalPlan` of ``records`` (the columns every one of them has) for ``rewards``
    (name -> (NamedReward, required columns), as ``preflight.check_rewards`` returns them)."""
    have = set.intersection(*[{k for k, v in r.columns.items() if v is not None} for r in records]) \
        if records else set()
    plan = EvalPlan(used=[])
    for name, (_, cols) in rewards.items():
        need = set(cols) - PIPELINE_COLUMNS
        missing = sorted(need - have)
        if missing:
            plan.skipped[name] = missing
            continue
        plan.used.append(name)
        if need:
            plan.accuracy.append(name)
    return plan


def _first_line(e: BaseException) -> str:
    text = str(e).strip() or type(e).__name__
    return text.splitlines()[0][:300]
