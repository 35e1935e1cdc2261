"""The config tree described from its own fields: every ``section.key``, its default as YAML, its
description and, for an enumerated field, the values it takes. ``grpo-dist train --help-config``
prints it; the docs' configuration reference is generated from :func:`field_docs` (one source)."""

from __future__ import annotations

import textwrap
import typing
from dataclasses import dataclass

from pydantic import BaseModel

from grpo_dist.config.base import ConfigError
from grpo_dist.config.root import Config


@dataclass(frozen=True)
class FieldDoc:
    section: str
    path: str  # ``section.key`` (``section`` alone for a top-level scalar)
    default: str  # one line of YAML, as written in a config file or after ``--section.key``
    description: str
    allowed: str | None  # ``one of: a, b`` for an enumerated field, else None


def yaml_value(v) -> str:
    """``v`` as one line of YAML, as it is written in a config file or after ``--section.key``."""
    import yaml

    def plain(x):
        return [plain(y) for y in x] if isinstance(x, (list, tuple)) else \
            {k: plain(y) for k, y in x.items()} if isinstance(x, dict) else x

    text = yaml.safe_dump(plain(v), default_flow_style=True, width=10**6, sort_keys=False).strip()
    return text.removesuffix("...").strip()


def allowed_values(annotation) -> str | None:
    """The values an enumerated (Literal) field takes: ``one of: a, b`` (``or null`` for an
    Optional one, ``an integer or auto`` for ``int | Literal["auto"]``); None for other fields."""
    literals, others = [], []

    def walk(t):
        if typing.get_origin(t) is typing.Literal:
            literals.extend(typing.get_args(t))
        elif typing.get_origin(t) is typing.Union:
            for a in typing.get_args(t):
                walk(a)
        else:
            others.append({int: "an integer", float: "a number", type(None): "null"}.get(t, getattr(t, "__name__", str(t))))

    walk(annotation)
    if not literals:
        return None
    values = ", ".join(str(x) for x in literals)
    extra = [o for o in others if o != "null"]
    if extra:
        return f"{' or '.join(extra)}, or {values}" + (" or null" if "null" in others else "")
    return f"one of: {values}" + (", null" if "null" in others else "")


def field_default(f):
    """A field's default value as plain data (config models dumped to dicts)."""
    v = f.default_factory() if f.default_factory is not None else f.default
    if isinstance(v, list):
        v = [x.model_dump(mode="json") if isinstance(x, BaseModel) else x for x in v]
    return v.model_dump(mode="json") if isinstance(v, BaseModel) else v


def field_docs(section: str | None = None) -> list[FieldDoc]:
    """Every config field (of one section, or all) in the tree's order. ConfigError for an
    unknown section."""
    sections = Config.model_fields
    if section is not None and section not in sections:
        raise ConfigError(f"--help-config: unknown section {section!r} (one of {' '.join(sections)})")
    out: list[FieldDoc] = []
    for name, f in sections.items():
        if section not in (None, name):
            continue
        sub = f.annotation if isinstance(f.annotation, type) and issubclass(f.annotation, BaseModel) else None
        fields = sub.model_fields.items() if sub is not None else [(None, f)]
        for key, ff in fields:
            out.append(FieldDoc(name, name if key is None else f"{name}.{key}", yaml_value(field_default(ff)),
                                ff.description or "", allowed_values(ff.annotation)))
    return out


def describe_fields(section: str | None = None) -> list[str]:
    """Every config field as ``section.key = default`` (YAML) and its description, and the
    allowed values of an enumerated field (one section or all): the lines of ``--help-config``."""
    out: list[str] = []
    for d in field_docs(section):
        out.append(f"{d.path} = {d.default}")
        out += textwrap.wrap(d.description, width=96, initial_indent="    ", subsequent_indent="    ")
        if d.allowed:
            out.append(f"    {d.allowed}")
    return out
