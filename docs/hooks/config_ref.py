"""mkdocs hook: writes the configuration reference (reference/config.md) at build time.

The page is made from the config models themselves (``grpo_dist.config.Config`` and its
sections: each field's type, default, constraints and ``description=``), so the reference cannot
drift from the code and is never committed. Defaults and descriptions come from
``grpo_dist.config.describe.field_docs`` (what ``--help-config`` prints); types, bounds and nested
entries from the fields.
``python docs/hooks/config_ref.py`` prints the page.
"""

from __future__ import annotations

import sys
import typing
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGE = "reference/config.md"

INTRO = """# Configuration reference

Every key of the config tree, generated from the config models' own field descriptions
(`grpo_dist/config`) when this site is built. A YAML config sets any of them by section
(`rollout: {group_size: 16}`); on the command line they are `--section.key VALUE` (VALUE is
YAML). `grpo-dist train --help-config [SECTION]` prints the same on the console, and
`grpo-dist train --config FILE --print-config` the values a config resolves to. A default of
`null` is filled at start from the devices or other keys (the description says how). Names used
by TRL and verl map to these keys: [coming from TRL or verl](../coming-from-trl-verl.md).
"""


def _import_config():
    # The checkout being documented, not whatever grpo_dist the environment has installed.
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from pydantic import BaseModel

    from grpo_dist.config import Config
    return Config, BaseModel


def _field_docs() -> dict:
    """``section.key`` -> the default (YAML) and description that ``grpo-dist train --help-config``
    prints (``grpo_dist.config.describe.field_docs``: one source for the console and this page)."""
    from grpo_dist.config.describe import field_docs

    return {d.path: d for d in field_docs()}


def _type(t) -> str:
    """A field's annotation in words: ``integer``, ``one of: a, b``, ``list of string``, ``... or null``."""
    origin, args = typing.get_origin(t), typing.get_args(t)
    if origin is typing.Literal:
        return "one of: " + ", ".join(f"`{a}`" for a in args)
    if origin is typing.Union or (origin is not None and getattr(origin, "__name__", "") == "UnionType"):
        parts = [_type(a) for a in args if a is not type(None)]
        literals = [p for p in parts if p.startswith("one of: ")]
        others = [p for p in parts if not p.startswith("one of: ")]
        text = " or ".join(others + [lit.removeprefix("one of: ") for lit in literals]) if others else " or ".join(parts)
        return text + (" or null" if type(None) in args else "")
    if origin in (list, tuple, set):
        inner = [a for a in args if a is not Ellipsis]
        return "list" + (f" of {_type(inner[0])}" if inner else "")
    if origin is dict:
        return "mapping" + (f" of {_type(args[0])} to {_type(args[1])}" if args else "")
    if t is typing.Any:
        return "any"
    names = {int: "integer", float: "number", str: "string", bool: "boolean", type(None): "null"}
    if t in names:
        return names[t]
    return f"`{t.__name__}`" if isinstance(t, type) else str(t)


def _constraints(field) -> str:
    signs = {"gt": ">", "ge": ">=", "lt": "<", "le": "<="}
    out = []
    for m in field.metadata:
        for attr, sign in signs.items():
            value = getattr(m, attr, None)
            if value is not None:
                out.append(f"{sign} {value}")
    return ", ".join(out)


def _default(field, base_model) -> str:
    """A nested model's field default as YAML (what ``field_docs`` gives for the sections' own)."""
    from pydantic_core import PydanticUndefined

    from grpo_dist.config.describe import field_default, yaml_value

    if field.default_factory is None and field.default is PydanticUndefined:
        return "(required)"
    return f"`{yaml_value(field_default(field))}`"


def _cell(text: str) -> str:
    """One table cell: one line, pipes escaped (a prose ``<name>`` is kept as text by placeholders.py)."""
    return " ".join(text.split()).replace("|", "\\|")


def _nested_models(t, base_model) -> list:
    """The config models inside an annotation (``Optional[TinyModelSpec]``, ``list[RewardFnConfig]``)."""
    if isinstance(t, type) and issubclass(t, base_model):
        return [t]
    return [m for a in typing.get_args(t) for m in _nested_models(a, base_model)]


def _table(prefix: str, model, base_model, out: list[str], docs: dict) -> list[tuple[str, type]]:
    """One row per field of ``model``; returns the nested models to describe after it."""
    out += ["| key | type | default | description |", "|---|---|---|---|"]
    nested = []
    for name, field in model.model_fields.items():
        kind = _type(field.annotation)
        limits = _constraints(field)
        if limits:
            kind += f", {limits}"
        doc = docs.get(f"{prefix}{name}")
        default = f"`{doc.default}`" if doc is not None else _default(field, base_model)
        description = doc.description if doc is not None else field.description or ""
        out.append(f"| `{prefix}{name}` | {_cell(kind)} | {_cell(default)} | {_cell(description)} |")
        for sub in _nested_models(field.annotation, base_model):
            is_list = typing.get_origin(field.annotation) is list
            nested.append((f"{prefix}{name}" + ("[]" if is_list else ""), sub))
    return nested


def render() -> str:
    """The reference page as markdown: the top-level keys, then one section per config section."""
    config, base_model = _import_config()
    docs = _field_docs()
    out = [INTRO]
    sections, top = [], []
    for name, field in config.model_fields.items():
        sub = field.annotation
        if isinstance(sub, type) and issubclass(sub, base_model):
            sections.append((name, sub, field))
        else:
            top.append(name)
    out += ["## Top level", ""]
    top_level = type("TopLevel", (), {"model_fields": {name: config.model_fields[name] for name in top}})
    _table("", top_level, base_model, out, docs)
    out.append("")
    out.append("Sections: " + ", ".join(f"[`{name}`](#{name})" for name, _, _ in sections) + ".")
    out.append("")
    for name, model, field in sections:
        out += [f"## {name}", ""]
        doc = (field.description or typing.cast(str, model.__doc__) or "").strip()
        if doc:
            out += [" ".join(doc.split()), ""]
        nested = _table(f"{name}.", model, base_model, out, docs)
        out.append("")
        while nested:
            path, sub = nested.pop(0)
            out += [f"### {path}", "", f"Each `{path}` entry:" if path.endswith("[]") else f"The keys under `{path}`:", ""]
            prefix = f"{path}." if not path.endswith("[]") else ""
            nested += _table(prefix, sub, base_model, out, {})
            out.append("")
    return "\n".join(out)


def on_files(files, config):
    """mkdocs event: add the generated page to the site's files (it exists only in the build)."""
    from mkdocs.structure.files import File

    files.append(File.generated(config, PAGE, content=render()))
    return files


if __name__ == "__main__":
    print(render())
