"""Checkpoints: ``<checkpoint.dir>/step_<n>/`` holds the learner's DeepSpeed state (optimizer,
scheduler, step), the adapter in PEFT format (``adapter/``), and ``trainer_state.json`` (step,
data position, the driver process's Python ``random`` state and torch's initial seed).
``checkpoint.resume: auto`` continues from the newest one.

RNG: resuming restores only the driver's Python ``random`` state. No actor's RNG is saved: the
learner's torch generators (LoRA dropout) and the rollout engines' sampling start again from their
configured seeds, so a resumed run is not bit-identical to an uninterrupted one.
"""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path
from typing import Any

from grpo_dist.config import Config

STATE_FILE = "trainer_state.json"


def step_dir(cfg: Config, step: int) -> Path:
    return cfg.checkpoint_dir / f"step_{step:06d}"


def list_checkpoints(directory: Path) -> list[Path]:
    """Complete checkpoints (those with a trainer_state.json), oldest first."""
    if not directory.is_dir():
        return []
    done = [p for p in directory.glob("step_*") if (p / STATE_FILE).is_file()]
    return sorted(done, key=lambda p: int(p.name.split("_")[1]))


def _rng_state() -> dict[str, Any]:
    import torch

    version, internal, gauss = random.getstate()
    return {"python": [version, list(internal), gauss], "torch_seed": int(torch.initial_seed())}


def save(cfg: Config, workers, step: int, data_state: dict) -> Path:
    """``data_state``: the prompt stream's position to resume from (before any prompts already
    taken for rollouts that no step has trained on yet)."""
    out = step_dir(cfg, step)
    out.mkdir(parents=True, exist_ok=True)
    state = {"step": step, "data": data_state, "rng": _rng_state()}
    lg = workers.learner
    lg.get(lg.call("save_checkpoint", str(out), {"step": step}))
    (out / STATE_FILE).write_text(json.dumps(state, indent=1))  # written last: marks it complete
    for old in list_checkpoints(cfg.checkpoint_dir)[: -cfg.checkpoint.keep]:
        shutil.rmtree(old, ignore_errors=True)
    return out


def resolve(cfg: Config) -> Path | None:
    r = cfg.checkpoint.resume
    if not r:
        return None
    if r == "auto":
        found = list_checkpoints(cfg.checkpoint_dir)
        return found[-1] if found else None
    p = Path(r)
    if not (p / STATE_FILE).is_file():
        raise FileNotFoundError(f"checkpoint.resume: {p} is not a complete checkpoint (no {STATE_FILE})")
    return p


def restore(cfg: Config, workers, stream) -> int:
    """Load the learner state and data position; returns the step to continue from (0 if none)."""
    path = resolve(cfg)
    if path is None:
        return 0
    state = json.loads((path / STATE_FILE).read_text())
    lg = workers.learner
    lg.get(lg.call("load_checkpoint", str(path)))
    stream.load_state_dict(state["data"])
    version, internal, gauss = state["rng"]["python"]
    random.setstate((version, tuple(internal), gauss))
    return int(state["step"])
