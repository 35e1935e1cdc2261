"""Where a relative path of the config points: the user's directory, also inside a Ray job.

A `ray job submit` driver runs in Ray's temporary copy of the working dir; a relative path there
would land in that copy and be lost. ``launch/submit_job.sh`` passes the submitter's directory in
``GRPO_DIST_SUBMIT_DIR``; relative paths resolve against it. The config's own checks (e.g. that a
full-weight run's ``output_dir`` lies in ``cluster.shared_dir``) and the run's resolution share
:func:`user_base`, so they cannot disagree.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

SUBMIT_DIR_ENV = "GRPO_DIST_SUBMIT_DIR"  # set by launch/submit_job.sh: the submitter's directory


def in_ray_job() -> bool:
    """True in the driver of a `ray job submit` (its cwd is Ray's temporary copy of the working dir)."""
    return "RAY_JOB_CONFIG_JSON_ENV_VAR" in os.environ or "/runtime_resources/" in str(Path.cwd())


def user_base() -> Optional[Path]:
    """The directory relative paths resolve against: the cwd, or in a Ray job the submitter's
    directory (None when the job was submitted without it)."""
    if in_ray_job():
        base = os.environ.get(SUBMIT_DIR_ENV)
        return Path(base) if base else None
    return Path.cwd()


def user_path(path: str) -> Optional[Path]:
    """``path`` (``~`` expanded) made absolute against :func:`user_base`; None when relative in a
    Ray job without the submitter's directory."""
    p = Path(path).expanduser()
    if p.is_absolute():
        return p
    base = user_base()
    return None if base is None else base / p
