"""Checkpoints written by a real learner in this process, without Ray (tests of checkpoint files and
disk faults import these; the ``learner`` fixture is module-scoped where it is imported)."""

from __future__ import annotations

from pathlib import Path

import pytest

from grpo_dist.run import checkpoint


class Here:
    """The learner group's two calls (``call`` then ``get``) on one learner in this process."""

    def __init__(self, learner):
        self.learner = learner

    def call(self, method: str, *args):
        return [getattr(self.learner, method)(*args)]

    def get(self, refs, timeout=None):
        return refs


@pytest.fixture(scope="module")
def learner(tiny_model_dir, in_process_learners):
    from grpo_dist.testing.learner import make_learner, small_config

    lrn, _ = make_learner(small_config(tiny_model_dir))
    return lrn


def small_run_config(tiny_model_dir, out: Path, keep: int = 3):
    from grpo_dist.testing.learner import small_config

    cfg = small_config(tiny_model_dir)
    cfg.output_dir, cfg.checkpoint.keep = str(out), keep
    return cfg


def save_step(cfg, learner, step: int) -> Path:
    workers = type("W", (), {"learner": Here(learner)})()
    return checkpoint.save(cfg, workers, step, {"position": step}, {"history": [{"step": float(step)}]})
