"""Where a run's inputs are read from: a relative ``model.path`` or local data path resolves like
``output_dir`` (``outputs.py``): against the current directory, or, in the driver of a Ray job,
against the submitter's directory (``GRPO_DIST_SUBMIT_DIR``, set by ``launch/submit_job.sh``),
never against Ray's temporary copy of the working dir (which does not hold models or data: a
model would be generated again there on every submission).
"""

from __future__ import annotations

from pathlib import Path

from grpo_dist.config import Config
from grpo_dist.util.paths import user_base


def resolve_inputs(cfg: Config) -> Config:
    """A copy of ``cfg`` with absolute ``model.path`` (unless it names a hub model: ``org/name``
    with no such local directory and nothing to generate) and absolute local data paths (a
    ``builtin:``/``hf:`` source or a missing file stays as given: the pre-flight names it)."""
    from grpo_dist.hub import is_hub_id

    base = user_base()
    if base is None:
        return cfg
    cfg = cfg.model_copy(deep=True)
    m = cfg.model
    path = Path(m.path).expanduser()
    if not path.is_absolute():
        local = base / path
        if local.exists() or m.make_if_missing is not None or not is_hub_id(m.path):
            m.path = str(local)
    d = cfg.data
    for key in ("path", "eval_path"):
        value = getattr(d, key)
        if value and ":" not in value and not Path(value).expanduser().is_absolute() and (base / value).exists():
            setattr(d, key, str(base / value))
    return cfg
