"""``GRPOConfig``: TRL's options for this project's config (the Python API, docs/python-api.md).

``GRPOConfig(**options)`` takes, in any mix:

* TRL's names for what both have: the TRL column of ``aliases.ROWS`` (``num_generations``,
  ``learning_rate``, ``beta``, ...), converted where TRL's value means something else here
  (:data:`CONVERT`: ``loss_type="dr_grpo"`` is ``algo.agg: seq-mean-token-sum-norm``,
  ``report_to="none"`` is ``logging.wandb_mode: disabled``, ``epsilon`` sets both clips as TRL's
  does, ``generation_batch_size`` counts completions, ...);
* this project's keys: dotted (``**{"rollout.num_workers": 1}``), a section's mapping
  (``rollout={"num_workers": 1}``), or ``output_dir`` / ``adapters``;
* ``config=``: what the options apply on: a YAML file (as ``--config``), a mapping or a ``Config``;
  ``overrides=``: more keys, a mapping or the CLI's ``["--section.key", "VALUE", ...]``, applied last.

It is checked at once: an unknown option, a bad value or two options setting one key is one
``ConfigError`` line naming the option as it was written (``num_generations (rollout.group_size):
must be >= 2``). Two options need the trainer's arguments and are kept for it
(:data:`FOR_TRAINER`: ``num_train_epochs``, the dataset's size; ``reward_weights``, the functions).
Imports no torch, Ray or TRL.
"""

from __future__ import annotations

import difflib
import os
from pathlib import Path
from typing import Any, Callable

from grpo_dist.config.aliases import ALIASES
from grpo_dist.config.base import ConfigError
from grpo_dist.config.load import _merge, config_from_dict, config_keys, load_config, parse_overrides
from grpo_dist.config.root import Config

TRL_NAMES: dict[str, str] = {name: key for name, (key, origin, _) in ALIASES.items() if origin == "TRL"}
FOR_TRAINER = ("num_train_epochs", "reward_weights")
_TRL_BETAS = (0.9, 0.999)  # TrainingArguments' adam_beta1 / adam_beta2 defaults
# TRL's options without a counterpart here, and what to use instead
NO_COUNTERPART = {
    "logging_steps": "every step is logged (metrics.jsonl, W&B)",
    "logging_strategy": "every step is logged (metrics.jsonl, W&B)",
    "save_strategy": "checkpoint.every (save_steps) sets the cadence; 0 = none",
    "eval_strategy": "trainer.eval_every (eval_steps) sets the cadence",
    "warmup_ratio": "learner.warmup_steps (warmup_steps)",
    "remove_unused_columns": "every dataset column reaches the reward functions",
    "log_completions": "logging.sample_table_every",
    "push_to_hub": "grpo-dist export RUN_DIR OUT --push-to-hub REPO",
    "reward_funcs": "pass them to GRPOTrainer(reward_funcs=...)",
}
_LOSS_TYPES = {"grpo": "seq-mean-token-mean", "dr_grpo": "seq-mean-token-sum-norm", "dapo": "token-mean",
               "bnpo": "token-mean"}


def _choice(table: dict, what: str) -> Callable[[Any], Any]:
    def get(v: Any) -> Any:
        if isinstance(v, bool) or v not in table:
            raise ValueError(f"{v!r} is not one of {', '.join(map(repr, table))} ({what})")
        return table[v]
    return get


def _wandb(v: Any) -> str:
    names = [v] if isinstance(v, str) else list(v or [])
    if any(n in ("wandb", "all") for n in names):
        return "online"
    if all(n == "none" for n in names):
        return "disabled"
    raise ValueError(f"{v!r}: W&B is the one logger here ('wandb'; 'none' turns it off)")


def _dtype(v: Any) -> str:
    return str(v).removeprefix("torch.")


def _scale(v: Any) -> str:
    return {True: "group", False: "none"}[v] if isinstance(v, bool) else str(v)


def _betas(_: Any, o: dict) -> dict[str, Any]:
    return {"learner.betas": [o.get("adam_beta1", _TRL_BETAS[0]), o.get("adam_beta2", _TRL_BETAS[1])]}


def _hub(v: Any) -> str:
    v = str(v)
    return v if ":" in v or os.path.exists(v) else f"hf:{v}"


# TRL name -> (value, every option given) -> {our dotted key: value}; the other TRL names copy the value
CONVERT: dict[str, Callable[[Any, dict], dict[str, Any]]] = {
    "report_to": lambda v, o: {"logging.wandb_mode": _wandb(v)},
    "bf16": lambda v, o: {"model.dtype": "bfloat16" if v else "float32"},
    "torch_dtype": lambda v, o: {"model.dtype": _dtype(v)},
    "dtype": lambda v, o: {"model.dtype": _dtype(v)},
    "scale_rewards": lambda v, o: {"algo.adv_scale": _scale(v)},
    "loss_type": lambda v, o: {"algo.agg": _choice(_LOSS_TYPES, "TRL's loss types")(v)},
    "epsilon": lambda v, o: {"algo.clip_low": v, **({} if "epsilon_high" in o else {"algo.clip_high": v})},
    "use_vllm": lambda v, o: {"rollout.backend": "vllm" if v else "hf"},
    "adam_beta1": _betas,
    "adam_beta2": _betas,
    "sync_ref_model": lambda v, o: {"algo.ref_refresh_every": o.get("ref_model_sync_steps", 512) if v else 0},
    "ref_model_sync_steps": lambda v, o: {"algo.ref_refresh_every": v} if o.get("sync_ref_model") else {},
    "vllm_importance_sampling_correction": lambda v, o: {"algo.rollout_is": "truncate" if v else "none"},
    "resume_from_checkpoint": lambda v, o: {} if v in (None, False) else
    {"checkpoint.resume": "auto" if v is True else str(v)},
    "max_steps": lambda v, o: {} if v is None or v < 0 else {"trainer.steps": v},
    "top_k": lambda v, o: {} if v is None else {"rollout.top_k": -1 if v == 0 else v},
    "dataset_name": lambda v, o: {"data.path": _hub(v)},
    "generation_batch_size": lambda v, o: {},  # completions: prompts_per_step once the group size is known
    "gradient_accumulation_steps": lambda v, o: {},  # likewise, with the micro-batch
}


def nested(flat: dict[str, Any]) -> dict[str, Any]:
    """``{"rollout.num_workers": 1, "rollout": {"backend": "hf"}}`` -> one nested mapping; a key
    given twice with two values is a ConfigError."""
    out: dict[str, Any] = {}
    for key, value in flat.items():
        parts = key.split(".")
        node = out
        for p in parts[:-1]:
            node = node.setdefault(p, {})
            if not isinstance(node, dict):
                raise ConfigError(f"{key}: conflicts with {p}")
        leaf = parts[-1]
        if isinstance(value, dict) and isinstance(node.get(leaf), dict):
            value = _merge(node[leaf], value)
        elif leaf in node and node[leaf] != value:
            raise ConfigError(f"{key}: set twice ({node[leaf]!r} and {value!r})")
        node[leaf] = value
    return out


def _unknown(name: str) -> ConfigError:
    if name in NO_COUNTERPART:
        return ConfigError(f"{name}: TRL's option has no counterpart here: {NO_COUNTERPART[name]}")
    leaves = {k.rsplit(".", 1)[-1]: k for k in config_keys()}
    close = difflib.get_close_matches(name, list(TRL_NAMES) + list(leaves), n=1, cutoff=0.75)
    said = (f"; did you mean {close[0]}" + (f" ({TRL_NAMES[close[0]]})" if close[0] in TRL_NAMES else
                                             f" ({leaves[close[0]]})") + "?") if close else ""
    return ConfigError(f"{name}: unknown option (a TRL GRPOConfig name, a config key such as rollout.num_workers, "
                       f"or a section){said}")


def translate(options: dict[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    """``(flat {our dotted key: value}, {our key: the option that set it})`` of GRPOConfig's options."""
    flat: dict[str, Any] = {}
    set_by: dict[str, str] = {}

    def put(key: str, value: Any, name: str) -> None:
        if key in flat and flat[key] != value:
            raise ConfigError(f"{set_by[key]} and {name} both set {key} ({flat[key]!r} and {value!r})")
        flat[key], set_by[key] = value, name

    sections = set(Config.model_fields)
    for name, value in options.items():
        if name in TRL_NAMES or name in CONVERT:
            try:
                pairs = CONVERT[name](value, options) if name in CONVERT else {TRL_NAMES[name]: value}
            except (ValueError, KeyError, TypeError) as e:
                raise ConfigError(f"{name}: {e}") from None
            for key, v in pairs.items():
                put(key, v, name)
        elif name in sections or "." in name:
            if name in sections and isinstance(value, dict) and hasattr(Config.model_fields[name].annotation,
                                                                        "model_fields"):
                for k, v in value.items():
                    put(f"{name}.{k}", v, f"{name}.{k}")
            else:
                put(name, value, name)
        else:
            raise _unknown(name)
    return flat, set_by


class GRPOConfig:
    """TRL's GRPOConfig, as this project reads it (see the module's docstring). ``config`` is the
    checked :class:`~grpo_dist.config.Config`; attributes read as TRL's (``args.learning_rate``)
    or as sections (``args.rollout``)."""

    def __init__(self, output_dir: str | os.PathLike | None = None, *, config: Any = None,
                 overrides: dict[str, Any] | list[str] | None = None, **options: Any):
        if output_dir is not None:
            options["output_dir"] = str(output_dir)
        self.options = dict(options)  # as given
        self.for_trainer = {k: options.pop(k) for k in FOR_TRAINER if k in options}
        flat, self.set_by = translate(options)
        over = parse_overrides(overrides) if isinstance(overrides, list) else nested(dict(overrides or {}))
        self._over = _merge(nested(flat), over)
        self._base = config
        self.config = self.build()

    def build(self, updates: dict[str, Any] | None = None, set_by: dict[str, str] | None = None) -> Config:
        """The checked config of these options with ``updates`` (nested, the trainer's arguments:
        ``set_by`` names them in errors) applied last."""
        names = {"--config": "config", **self.set_by, **(set_by or {})}
        data = _merge(self._over, updates or {})
        try:
            cfg = self._load(data)
            derived = self._derived(cfg)
            return self._load(_merge(data, nested(derived))) if derived else cfg
        except ConfigError as e:
            raise ConfigError(_named(str(e), names)) from None

    def _load(self, data: dict[str, Any]) -> Config:
        base = self._base
        if base is None or isinstance(base, (str, Path)):
            return load_config(base, data)
        raw = base.model_dump() if isinstance(base, Config) else dict(base)
        return config_from_dict(_merge(raw, data))

    def _derived(self, cfg: Config) -> dict[str, Any]:
        """TRL's batch options, which count completions: ``generation_batch_size``, or
        ``per_device_train_batch_size`` x ranks x ``gradient_accumulation_steps``, over the group size."""
        o, g = self.options, cfg.rollout.group_size
        if "generation_batch_size" in o:
            name, total = "generation_batch_size", o["generation_batch_size"]
        elif "gradient_accumulation_steps" in o:
            name = "gradient_accumulation_steps"
            total = cfg.learner.micro_batch_size * cfg.learner.num_learners * o[name]
        else:
            return {}
        if not isinstance(total, int) or total <= 0 or total % g:
            raise ConfigError(f"{name}: {total} completions a step is not a multiple of num_generations "
                              f"(rollout.group_size) {g}")
        if "rollout.prompts_per_step" in self.set_by and self.set_by["rollout.prompts_per_step"] != name:
            raise ConfigError(f"{name} and rollout.prompts_per_step both set the prompts of a step")
        return {"rollout.prompts_per_step": total // g}

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_") or "config" not in self.__dict__:
            raise AttributeError(name)
        if name in self.__dict__.get("options", {}):
            return self.options[name]
        obj: Any = self.config
        for part in TRL_NAMES.get(name, name).split("."):
            try:
                obj = getattr(obj, part)
            except AttributeError:
                raise AttributeError(f"GRPOConfig has no option {name!r}") from None
        return obj

    def __repr__(self) -> str:
        return f"GRPOConfig({', '.join(f'{k}={v!r}' for k, v in self.options.items())})"


def _named(msg: str, names: dict[str, str]) -> str:
    """``rollout.group_size: ...`` -> ``num_generations (rollout.group_size): ...`` where the user
    wrote that key under another name."""
    key, _, rest = msg.partition(":")
    name = names.get(key)
    return f"{name} ({key}):{rest}" if name and name != key and rest else msg
