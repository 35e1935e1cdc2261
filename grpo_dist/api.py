"""The Python API, as TRL users write it (docs/python-api.md)::

    from grpo_dist import GRPOConfig, GRPOTrainer

    trainer = GRPOTrainer(model="Qwen/Qwen2.5-0.5B-Instruct", reward_funcs=[my_reward],
                          args=GRPOConfig(output_dir="runs/mine", num_generations=8, max_steps=100),
                          train_dataset=ds, peft_config=LoraConfig(r=16, lora_alpha=32))
    summary = trainer.train()

``GRPOTrainer`` turns its arguments into the run's config (``config/trl.py`` reads the options) and
``train()`` runs it as ``grpo-dist train`` does, through ``runner.train_config``: the same pre-flight,
lock, Ctrl-C handling, W&B, checkpoints and ``summary.json``. What cannot be a config value travels
as files or by value: an in-memory dataset is written as ``<output_dir>/datasets/<split>-<hash>.jsonl``
(``data/memory.py``) and ``data.path`` names it; a reward function that an actor cannot import by
name reaches the reward actors pickled by value (``util/callables.py``).
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from grpo_dist.config import Config, ConfigError
from grpo_dist.config.trl import GRPOConfig
from grpo_dist.util.callables import callable_name

__all__ = ["GRPOConfig", "GRPOTrainer"]

DATA_DIR = "datasets"  # <output_dir>/datasets/: the in-memory datasets as jsonl files


class GRPOTrainer:
    """TRL's ``GRPOTrainer(model, reward_funcs, args, train_dataset, eval_dataset, peft_config)``.

    * ``model``: a local model directory or a hub id (``model.path``); default: the config's.
    * ``reward_funcs``: a function or a list; each a callable with TRL's signature (``completions``,
      ``prompts`` and the dataset's columns as keyword arguments: docs/rewards.md), a spec string
      (``correctness``, ``module:function``, ``file.py:function``) or a ``reward.functions`` entry
      (``{"fn": f, "name": ..., "weight": ..., "kwargs": {...}}``); ``args.reward_weights`` weighs them.
    * ``train_dataset`` / ``eval_dataset``: a ``datasets.Dataset``, a list of dicts, a pandas DataFrame,
      or a source string as ``data.path`` takes it. Without ``eval_dataset`` (and no ``data.eval_path``
      in the config) there is no held-out evaluation, as in TRL.
    * ``peft_config``: a ``peft.LoraConfig`` (``lora.r``, ``alpha``, ``dropout``, ``target_modules``).
    * ``callbacks``: objects with ``on_step(run, step, metrics, groups, batch)`` (``run.Run``).

    The config is built and checked here: a bad option is a ``ConfigError`` (one line) before
    anything starts. ``config`` is the resolved :class:`~grpo_dist.config.Config`.
    """

    def __init__(self, model: str | os.PathLike | None = None, reward_funcs: Any = None,
                 args: GRPOConfig | None = None, train_dataset: Any = None, eval_dataset: Any = None,
                 peft_config: Any = None, callbacks: Any = None, processing_class: Any = None):
        self.args = args if args is not None else GRPOConfig()
        if not isinstance(self.args, GRPOConfig):
            raise ConfigError(f"args: expected a grpo_dist.GRPOConfig, got {type(self.args).__name__}")
        if processing_class is not None:
            raise ConfigError("processing_class: the engines and the learner load the tokenizer from the model's "
                              "directory; save yours there (tokenizer.save_pretrained(model_dir))")
        base = self.args.config
        updates: dict[str, Any] = {}
        names: dict[str, str] = {}
        if model is not None:
            updates["model"] = _model(model)
            names["model.path"] = "model"
        if peft_config is not None:
            updates["lora"] = _lora(peft_config)
            names.update({f"lora.{k}": f"peft_config.{v}" for k, v in _PEFT.items()})
        if reward_funcs is not None or "reward_weights" in self.args.for_trainer:
            updates["reward"] = {"functions": _rewards(reward_funcs, base, self.args.for_trainer.get("reward_weights"))}
        self._files: dict[Path, bytes] = {}
        self._train_rows: list[dict[str, Any]] | None = None
        data = self._data(base, train_dataset, eval_dataset)
        if data:  # (an empty mapping would replace the section)
            updates["data"] = data
        self.callbacks = _callbacks(callbacks)
        cfg = self.args.build(updates, names)
        epochs = self.args.for_trainer.get("num_train_epochs")
        if epochs is not None and "trainer.steps" not in self.args.set_by:
            cfg = self.args.build(_merge_steps(updates, self._epoch_steps(cfg, epochs)), names)
        self.config: Config = cfg
        self.summary: dict[str, Any] | None = None

    def train(self, resume_from_checkpoint: bool | str | None = None) -> dict[str, Any]:
        """Pre-flight, then the run, as ``grpo-dist train`` (``runner.train_config``); the summary
        (what ``<output_dir>/summary.json`` holds). ``resume_from_checkpoint``: True (the newest
        checkpoint in ``output_dir``, ``checkpoint.resume: auto``) or a checkpoint's path.
        Raises ``ConfigError`` (nothing started), ``TrainingError`` (the run stopped: the step
        and how to resume), ``Interrupted`` (Ctrl-C: the checkpoint saved)."""
        from grpo_dist.runner import train_config

        cfg = self.config
        if resume_from_checkpoint not in (None, False):
            resume = "auto" if resume_from_checkpoint is True else str(resume_from_checkpoint)
            cfg = cfg.model_copy(update={"checkpoint": cfg.checkpoint.model_copy(update={"resume": resume})})
        self.summary = train_config(cfg, callbacks=tuple(self.callbacks), files=self._files)
        return self.summary

    # ------------------------------------------------------------------------------ the arguments
    def _data(self, base: Config, train: Any, evals: Any) -> dict[str, Any]:
        """``data`` keys for the datasets; in-memory ones become files to write under output_dir."""
        out: dict[str, Any] = {}
        if train is None and evals is None:
            return out
        if train is not None:
            out["path"] = self._source(train, "train_dataset", "train", base)
        if evals is not None:
            out["eval_path"] = self._source(evals, "eval_dataset", "eval", base)
        elif train is not None and "eval_path" not in base.data.model_fields_set:
            out["eval_path"] = None  # TRL: no eval_dataset, no evaluation (not prompts held out of training)
        rows = self._train_rows
        if rows is not None and "chat_template" not in base.data.model_fields_set:
            from grpo_dist.data.memory import conversational

            if conversational(rows, base.data.prompt_column):  # TRL's conversational prompts: the chat template
                out["chat_template"] = True
        return out

    def _source(self, data: Any, key: str, stem: str, base: Config) -> str:
        if isinstance(data, (str, os.PathLike)):
            return str(data)
        from grpo_dist.data.memory import dataset_file
        from grpo_dist.util.paths import user_path

        try:
            name, body, rows = dataset_file(data, key, stem)
        except ValueError as e:
            raise ConfigError(str(e)) from None
        out = user_path(base.output_dir)
        if out is None:
            raise ConfigError(f"output_dir: {key} is written there, and the relative path {base.output_dir!r} has no "
                              f"base in this Ray job: give an absolute path")
        path = out / DATA_DIR / name
        self._files[path] = body
        if stem == "train":
            self._train_rows = rows
        return str(path)

    def _epoch_steps(self, cfg: Config, epochs: float) -> int:
        if self._train_rows is None:
            raise ConfigError("num_train_epochs: counts passes over an in-memory train_dataset; with the config's "
                              "data.path set max_steps")
        return max(1, math.ceil(epochs * len(self._train_rows) / cfg.rollout.prompts_per_step))


def _merge_steps(updates: dict[str, Any], steps: int) -> dict[str, Any]:
    return {**updates, "trainer": {**updates.get("trainer", {}), "steps": steps}}


def _model(model: Any) -> dict[str, Any]:
    if not isinstance(model, (str, os.PathLike)):
        raise ConfigError(f"model: pass a model directory or a hub id, not a {type(model).__name__}: the engines and "
                          f"the learner load the model in their own processes (model.save_pretrained(dir) first)")
    return {"path": str(model), "make_if_missing": None}


_PEFT = {"r": "r", "alpha": "lora_alpha", "dropout": "lora_dropout", "target_modules": "target_modules"}


def _lora(peft: Any) -> dict[str, Any]:
    """``lora`` keys of a ``peft.LoraConfig``; what the learner would not honour is refused."""
    kind = str(getattr(peft, "peft_type", "") or "")
    if "LORA" not in kind.upper() or kind.upper().endswith(("ADALORA", "LORA_FA")):
        raise ConfigError(f"peft_config: a peft.LoraConfig, got {type(peft).__name__}")
    said = {a: getattr(peft, a, None) for a in ("use_dora", "use_rslora", "modules_to_save", "layers_to_transform",
                                                 "rank_pattern", "alpha_pattern", "exclude_modules", "target_parameters")}
    said.update(bias=getattr(peft, "bias", "none") != "none" and peft.bias,
                init_lora_weights=getattr(peft, "init_lora_weights", True) is not True and peft.init_lora_weights)
    for attr, value in said.items():
        if value:
            raise ConfigError(f"peft_config.{attr}: {value!r} is not supported here (the learner trains plain LoRA: "
                              f"r, lora_alpha, lora_dropout, target_modules)")
    out = {"enabled": True, "r": peft.r, "alpha": peft.lora_alpha, "dropout": peft.lora_dropout}
    targets = peft.target_modules
    if isinstance(targets, str) and targets != "all-linear":
        raise ConfigError(f"peft_config.target_modules: {targets!r} is a regular expression; give the module names "
                          f"as a list")
    if targets is not None and not isinstance(targets, str):  # None / all-linear: every projection (lora's default)
        out["target_modules"] = sorted(targets) if isinstance(targets, (set, frozenset)) else list(targets)
    return out


def _rewards(funcs: Any, base: Config, weights: Any) -> list[dict[str, Any]]:
    """``reward.functions`` of ``reward_funcs`` (the config's own when None), weighted by
    ``reward_weights``; unnamed callables that share a name get ``_2``, ``_3``, ..."""
    if funcs is None:
        entries = [f.model_dump() for f in base.reward.functions]
    else:
        items = list(funcs) if isinstance(funcs, (list, tuple)) else [funcs]
        entries, seen = [], set()
        for i, f in enumerate(items):
            if isinstance(f, Mapping):
                entry = dict(f)
            elif isinstance(f, str) or callable(f):
                entry = {"fn": f}
            else:
                raise ConfigError(f"reward_funcs[{i}]: expected a function, a spec string or a mapping, got "
                                  f"{type(f).__name__}")
            fn = entry.get("fn")
            name = entry.get("name") or (callable_name(fn) if callable(fn) else str(fn).rpartition(":")[2])
            if callable(fn) and not entry.get("name"):  # two lambdas: <lambda>, <lambda>_2
                first, k = name, 2
                while name in seen:
                    name, k = f"{first}_{k}", k + 1
                if name != first:
                    entry["name"] = name
            seen.add(name)
            entries.append(entry)
    if weights is not None:
        weights = list(weights)
        if len(weights) != len(entries):
            raise ConfigError(f"reward_weights: {len(weights)} weights for {len(entries)} reward functions")
        entries = [{**e, "weight": w} for e, w in zip(entries, weights)]
    return entries


def _callbacks(callbacks: Any) -> list[Any]:
    out = list(callbacks or [])
    for i, cb in enumerate(out):
        if not callable(getattr(cb, "on_step", None)):
            raise ConfigError(f"callbacks[{i}]: {type(cb).__name__} has no on_step(run, step, metrics, groups, batch) "
                              f"(TRL's TrainerCallback events are not called here)")
    return out
