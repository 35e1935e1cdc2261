"""Several adapters in one run (issue 53): the ``adapters:`` list and ``--sweep``.

An entry of ``adapters:`` is ``{name: NAME, <section>: {<key>: value, ...}, ...}``: the run's config
with those keys changed is that adapter's config. Only what an adapter can own is accepted
(:data:`PER_ADAPTER`): its data and evaluation sets, rewards, ``algo``, the learner's optimizer and
schedule, the LoRA rank, alpha and dropout, its seed, steps and time budget, and the rollout's group
size, prompts per step, max tokens and temperature. The rest -- the base model, the engines, the
cluster, the sync, the learner's ranks and ZeRO stage -- is the fleet the adapters share, and an
adapter that sets it is refused in one line naming the key.

An adapter that names ``algo.preset`` starts its ``algo`` section from that preset (and its own
``algo`` keys), not from the run's: a preset fills only what is unset, and every key of the run's
section would count as set.

``--sweep KEY=V1,V2,...`` makes one adapter per value, named ``KEY=V`` with the value as written;
several ``--sweep`` flags cross (names joined by ``,``).
"""

from __future__ import annotations

import itertools
import re
from typing import TYPE_CHECKING, Any

import yaml

from grpo_dist.config.base import ConfigError

if TYPE_CHECKING:
    from grpo_dist.config.root import Config

# section -> the keys an adapter may set (None: every key of the section)
PER_ADAPTER: dict[str, frozenset[str] | None] = {
    "data": None, "eval": None, "reward": None, "algo": None,
    "learner": frozenset({"lr", "lr_schedule", "warmup_steps", "weight_decay", "betas", "grad_clip"}),
    "lora": frozenset({"r", "alpha", "dropout"}),
    "trainer": frozenset({"seed", "steps", "max_minutes"}),
    "rollout": frozenset({"group_size", "prompts_per_step", "max_tokens", "temperature"}),
}
_NAME = re.compile(r"^[A-Za-z0-9_.=,+-][A-Za-z0-9_.=,+-]*$")
# the fields of an adapter's config that must equal the base's: they shape the base model, the
# process group or the engine's partitioning, which the adapters share
SHARED_KEYS = ("model", "learner.num_learners", "learner.zero_stage", "learner.gradient_checkpointing",
               "learner.comm_backend", "cluster.learner_gpus", "lora.enabled", "lora.target_modules", "lora.dtype")


def _get(cfg: Config, dotted: str):
    obj = cfg
    for part in dotted.split("."):
        obj = getattr(obj, part)
    return obj.model_dump() if hasattr(obj, "model_dump") else obj


def check_shared(cfgs: dict[str, "Config"]) -> None:
    """Every adapter agrees with the first on :data:`SHARED_KEYS`; several adapters need LoRA and
    ZeRO stage <= 2. A ``ValueError`` naming the adapter and the key otherwise."""
    names = list(cfgs)
    first = cfgs[names[0]]
    if len(cfgs) > 1 and not first.lora.enabled:
        raise ValueError("adapters: several adapters share one base, which needs lora.enabled: true")
    if len(cfgs) > 1 and first.learner.zero_stage == 3:
        raise ValueError("adapters: learner.zero_stage 3 partitions the base inside one engine; adapters sharing "
                         "a base need zero_stage 0, 1 or 2")
    for name in names[1:]:
        for key in SHARED_KEYS:
            if _get(cfgs[name], key) != _get(first, key):
                raise ValueError(f"adapters.{name}: {key} must equal the other adapters' (the base is shared): "
                                 f"{_get(cfgs[name], key)!r} != {_get(first, key)!r}")


ADAPTERS_DIR = "adapters"  # OUTPUT_DIR/adapters/NAME/: an adapter's own outputs


def _allowed(section: str, key: str) -> bool:
    keys = PER_ADAPTER.get(section, frozenset())
    return keys is None or key in keys


def check_entry(i: int, entry: Any) -> tuple[str, dict[str, Any]]:
    """``(name, overrides)`` of the ``i``-th entry, or a ``ConfigError`` naming the key."""
    if not isinstance(entry, dict):
        raise ConfigError(f"adapters.{i}: expected a mapping with a name, got {entry!r}")
    name = entry.get("name")
    if not isinstance(name, str) or not _NAME.match(name) or name in (".", ".."):
        raise ConfigError(f"adapters.{i}.name: {name!r} must be a name of letters, digits and _ . = , + - "
                          f"(it names the adapter's output directory)")
    over = {k: v for k, v in entry.items() if k != "name"}
    for section, keys in over.items():
        if not isinstance(keys, dict) or section not in PER_ADAPTER:
            shared = "" if section in PER_ADAPTER else " (it is shared by every adapter: set it for the run)"
            raise ConfigError(f"adapters.{name}.{section}: an adapter sets keys of "
                              f"{', '.join(sorted(PER_ADAPTER))}{shared}")
        for key in keys:
            if not _allowed(section, key):
                raise ConfigError(f"adapters.{name}.{section}.{key}: not per adapter (the adapters share it: the base, "
                                  f"the engines and the learner's ranks); per adapter: "
                                  f"{', '.join(sorted(PER_ADAPTER[section] or ()))}")
    return name, over


def derive(base: dict[str, Any], name: str, over: dict[str, Any], output_dir: str) -> dict[str, Any]:
    """The adapter's config as a mapping: ``base`` (the run's, without ``adapters``) with ``over``
    applied section by section, its outputs under ``output_dir/adapters/NAME``."""
    out = {k: (dict(v) if isinstance(v, dict) else v) for k, v in base.items() if k != "adapters"}
    for section, keys in over.items():
        if section == "algo" and "preset" in keys:
            out[section] = dict(keys)
        else:
            out[section] = {**out.get(section, {}), **keys}
    out["output_dir"] = f"{output_dir.rstrip('/')}/{ADAPTERS_DIR}/{name}"
    if (out.get("checkpoint") or {}).get("dir"):
        out["checkpoint"] = {**out["checkpoint"], "dir": f"{out['checkpoint']['dir'].rstrip('/')}/{name}"}
    return out


def sweep_adapters(flags: list[str]) -> list[dict[str, Any]]:
    """``["learner.lr=1e-3,3e-3"]`` -> ``[{name: "learner.lr=1e-3", learner: {lr: 1e-3}}, ...]``;
    several flags cross."""
    axes = []
    for flag in flags:
        key, sep, raw = flag.partition("=")
        if not sep or not key or not raw:
            raise ConfigError(f"--sweep {flag!r}: expected KEY=V1,V2,... (e.g. learner.lr=1e-3,3e-3)")
        parts = key.split(".")
        if len(parts) != 2 or not _allowed(*parts) or parts[0] not in PER_ADAPTER:
            raise ConfigError(f"--sweep {key}: not a key an adapter can set (per adapter: "
                              f"{', '.join(sorted(PER_ADAPTER))} sections; see docs/adapters.md)")
        values = [v.strip() for v in raw.split(",")]
        if any(not v for v in values) or len(set(values)) != len(values):
            raise ConfigError(f"--sweep {key}: values must be distinct and non-empty (got {raw!r})")
        axes.append([(key, parts, v) for v in values])
    out = []
    for combo in itertools.product(*axes):
        entry: dict[str, Any] = {"name": ",".join(f"{key}={v}" for key, _, v in combo)}
        for _, (section, k), v in combo:
            entry.setdefault(section, {})[k] = _value(v)
        out.append(entry)
    return out


def _value(raw: str) -> Any:
    """A value as YAML reads it, with ``1e-3`` a number (YAML 1.1 wants ``1.0e-3``)."""
    try:
        return float(raw) if re.fullmatch(r"[-+]?\d+(\.\d*)?[eE][-+]?\d+", raw) else yaml.safe_load(raw)
    except yaml.YAMLError:
        raise ConfigError(f"--sweep: invalid value {raw!r}") from None


def check_fleet(cfg: "Config") -> None:
    """What a run of several adapters needs of the fleet they share (this version): engines that
    merge adapters in memory and switch between them (the vLLM engine in the actor's process, the
    CPU default) and the batch pipeline (``trainer.max_staleness`` works: each adapter's batches are
    queued ahead as in a run of its own). A ``ConfigError`` naming the key otherwise."""
    r, c = cfg.rollout, cfg.cluster
    lora_engines = r.adapter_mode == "lora" or (r.adapter_mode == "auto" and c.rollout_gpus > 0)
    refusals = [
        ("rollout.streaming", r.streaming, "false (the batch pipeline)"),
        ("rollout.backend", r.backend != "vllm", "vllm (engines that switch adapters by merging them)"),
        ("rollout.adapter_mode", lora_engines, "merged (multi-LoRA serving of several adapters, the GPU default, "
                                               "is not in this version)"),
        ("rollout.engine_in_process", not r.engine_in_process, "true (the engine merges adapters in memory)"),
        ("rollout.inflight_updates", r.inflight_updates, "false"),
        ("sync.transport", cfg.sync.transport == "collective", "object_store or filesystem"),
    ]
    for key, bad, need in refusals:
        if bad:
            raise ConfigError(f"{key}: several adapters (adapters: / --sweep) need {need}")
