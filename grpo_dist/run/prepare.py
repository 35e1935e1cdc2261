"""Pre-flight of a run, on the driver: the model directory, the prompt data, the monitors.

Everything here fails with one line naming the config key, before any actor starts.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from grpo_dist.config import Config, ConfigError

log = logging.getLogger("grpo_dist")


def prepare_model(cfg: Config, log_fn=print) -> None:
    """Check ``model.path``; fetch a hub model id into the HF cache (grpo_dist/hub.py); generate
    the local tiny model there if asked to and missing."""
    from grpo_dist.hub import fetch_model, is_hub_id, is_model_source

    path = Path(cfg.model.path)
    if (path / "config.json").is_file():
        return
    spec = cfg.model.make_if_missing
    if spec is None and is_hub_id(cfg.model.path):
        try:
            local = fetch_model(cfg.model.path, log_fn)
        except ValueError as e:
            raise ConfigError(f"model.path: {e}") from None
        if is_model_source(cfg.model.path):  # pkg:/GGUF: every role reads the converted directory
            log_fn(f"model.path {cfg.model.path} -> {local} (converted from GGUF; see {local}/SOURCE.json)")
            cfg.model.path = str(local)
        return
    if spec is None:
        raise ConfigError(f"model.path: no model at {path} (no config.json); set model.make_if_missing or run "
                          f"`grpo-dist make-tiny-model {path}`")
    from grpo_dist.models.tiny import make_tiny_model

    log_fn(f"model.path {path} missing: generating a local '{spec.size}' model"
           + (f" pretrained on '{spec.pretrain_task}'" if spec.pretrain_task else ""))
    make_tiny_model(str(path), size=spec.size, seed=spec.seed, pretrain_task=spec.pretrain_task,
                    steps=spec.steps, log=log_fn)


def _load(cfg: Config, path: str, split: str | None, limit: int | None, default_split: str) -> list[Any]:
    from grpo_dist.data import load_prompts

    d = cfg.data
    if path.startswith("builtin:") and split is None:
        split = default_split
    return load_prompts(path, split=split, prompt_column=d.prompt_column, answer_column=d.answer_column,
                        column_mapping=d.column_mapping or None, chat_template=d.chat_template,
                        tokenizer=cfg.model.path if d.chat_template else None, system_prompt=d.system_prompt,
                        limit=limit)


def load_data(cfg: Config, log_fn=print) -> tuple[list[Any], list[Any]]:
    """Training prompts and held-out prompts (possibly empty). ``data.eval_path: auto`` takes the
    source's test split, else holds ``data.eval_size`` prompts out of training (data/heldout.py)."""
    from grpo_dist.data.heldout import AUTO, hold_out, test_split_of

    d = cfg.data
    try:
        train = _load(cfg, d.path, d.split, d.limit, "train")
    except (ValueError, FileNotFoundError, KeyError) as e:
        raise ConfigError(f"data.path: {e}") from None
    if not train:
        raise ConfigError(f"data.path: no prompts in {d.path}")
    evals: list[Any] = []
    eval_path, eval_split = d.eval_path, d.eval_split
    if eval_path == AUTO:
        found = test_split_of(d.path, d.split)
        if found is None:
            n_all = len(train)
            train, evals = hold_out(train, d.eval_size, cfg.trainer.seed)
            log_fn(f"evaluation: {len(evals)} of the {n_all} prompts of {d.path} held out of training "
                   f"(no test split; data.eval_path auto, data.eval_size {d.eval_size})")
            return train, evals
        eval_path, eval_split = found[0], found[1] or eval_split
    if eval_path:
        try:
            evals = _load(cfg, eval_path, eval_split, d.eval_size, "eval")
        except (ValueError, FileNotFoundError, KeyError) as e:
            raise ConfigError(f"data.eval_path: {e}") from None
        if d.eval_path == AUTO:
            where = f"the {eval_split!r} split of {eval_path}" if eval_split else eval_path
            log_fn(f"evaluation: {len(evals[: d.eval_size])} prompts from {where} (data.eval_path auto)")
    return train, evals[: d.eval_size]


def load_extra(cfg: Config) -> dict[str, list[Any]]:
    """The extra held-out sets of ``eval.extra`` (name -> records, at most ``data.eval_size`` each;
    a builtin source's ``eval`` split unless the source names a split)."""
    out: dict[str, list[Any]] = {}
    for name, source in cfg.eval.extra.items():
        try:
            records = _load(cfg, source, None, cfg.data.eval_size, "eval")
        except (ValueError, FileNotFoundError, KeyError) as e:
            raise ConfigError(f"eval.extra.{name}: {e}") from None
        if not records:
            raise ConfigError(f"eval.extra.{name}: no prompts in {source}")
        out[name] = records[: cfg.data.eval_size]
    return out


def make_monitor(cfg: Config, group: str | None = None, prefix: str = ""):
    """W&B and the console; ``group``, ``prefix``: one adapter of several (its W&B run in the
    fleet's group, named after it; its console lines start with its name)."""
    from grpo_dist.run.monitor import ConsoleMonitor, MultiMonitor, WandbMonitor

    wb = WandbMonitor.from_config(cfg, default_name=prefix or None, group=group)
    multi = MultiMonitor([wb, ConsoleMonitor(enabled=cfg.logging.progress, max_minutes=cfg.trainer.max_minutes,
                                             prefix=prefix)])
    multi.wandb_dir = wb.run_dir
    return multi
