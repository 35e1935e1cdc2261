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
    """Check ``model.path``; generate the local tiny model there if asked to and missing."""
    path = Path(cfg.model.path)
    if (path / "config.json").is_file():
        return
    spec = cfg.model.make_if_missing
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


def load_data(cfg: Config) -> tuple[list[Any], list[Any]]:
    """Training prompts and held-out prompts (possibly empty)."""
    try:
        train = _load(cfg, cfg.data.path, cfg.data.split, cfg.data.limit, "train")
    except (ValueError, FileNotFoundError, KeyError) as e:
        raise ConfigError(f"data.path: {e}") from None
    if not train:
        raise ConfigError(f"data.path: no prompts in {cfg.data.path}")
    evals: list[Any] = []
    if cfg.data.eval_path:
        try:
            evals = _load(cfg, cfg.data.eval_path, cfg.data.eval_split, cfg.data.eval_size, "eval")
        except (ValueError, FileNotFoundError, KeyError) as e:
            raise ConfigError(f"data.eval_path: {e}") from None
    return train, evals[: cfg.data.eval_size]


def make_monitor(cfg: Config):
    from grpo_dist.config import dump_config
    from grpo_dist.monitor import ConsoleMonitor, MultiMonitor, WandbMonitor
    import yaml

    wandb_dir = Path(cfg.output_dir)
    wb = WandbMonitor(mode=cfg.logging.wandb_mode, project=cfg.logging.project, entity=cfg.logging.entity,
                      name=cfg.logging.run_name, directory=wandb_dir, config=yaml.safe_load(dump_config(cfg)))
    multi = MultiMonitor([wb, ConsoleMonitor(enabled=cfg.logging.progress)])
    multi.wandb_dir = wb.run_dir
    return multi
