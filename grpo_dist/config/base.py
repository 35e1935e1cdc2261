"""What every config section is built on: the one-line error, the section base, shared validators."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class ConfigError(ValueError):
    """A config problem, one line: ``<dotted.key>: <problem>``."""


class _KeyError(ValueError):
    def __init__(self, key: str, msg: str):
        super().__init__(msg)
        self.key, self.msg = key, msg


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


def _int_or_auto(v, low: int):
    if v != "auto" and v < low:
        raise ValueError(f"must be >= {low} or auto")
    return v
