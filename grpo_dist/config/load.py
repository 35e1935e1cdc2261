"""Loading: YAML + dotted overrides -> ``Config``; every problem is one ``ConfigError`` line."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from grpo_dist.config.adapters import check_entry, check_fleet, check_shared, derive, sweep_adapters
from grpo_dist.config.aliases import hint
from grpo_dist.config.root import Config
from grpo_dist.config.sections import ConfigError, _KeyError


def parse_overrides(args: list[str]) -> dict[str, Any]:
    """``["--algo.beta", "0.0", "--rollout.stop=[x]"]`` -> nested dict. Values are parsed as YAML."""
    out: dict[str, Any] = {}
    i = 0
    while i < len(args):
        a = args[i]
        if not a.startswith("--"):
            raise ConfigError(f"{a}: expected --section.key VALUE")
        key = a[2:]
        if "=" in key:
            key, raw = key.split("=", 1)
        else:
            if i + 1 >= len(args):
                raise ConfigError(f"{key}: missing value")
            raw = args[i + 1]
            i += 1
        i += 1
        try:
            value = yaml.safe_load(raw) if raw != "" else ""
        except yaml.YAMLError:
            raise ConfigError(f"{key}: invalid YAML value {raw!r}") from None
        node = out
        parts = key.split(".")
        for p in parts[:-1]:
            node = node.setdefault(p, {})
            if not isinstance(node, dict):
                raise ConfigError(f"{key}: conflicts with another override")
        node[parts[-1]] = value
    return out


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """``over`` into ``base``, mappings key by key; an empty mapping replaces (``--eval.extra {}``
    clears the sets a config file names)."""
    out = dict(base)
    for k, v in over.items():
        if isinstance(v, dict) and v and isinstance(out.get(k), dict):
            out[k] = _merge(out[k], v)
        else:
            out[k] = v
    return out


def config_keys() -> list[str]:
    """Every dotted key of the config (``rollout.group_size``; ``output_dir``)."""
    out = []
    for name, f in Config.model_fields.items():
        sub = getattr(f.annotation, "model_fields", None)
        out += [f"{name}.{k}" for k in sub] if sub else [name]
    return out


def _leaves(prefix: str, value: Any) -> list[str]:
    """The dotted paths under an unknown key whose value is a mapping (verl's nested sections)."""
    if isinstance(value, dict) and value:
        return [p for k, v in value.items() for p in _leaves(f"{prefix}.{k}", v)]
    return [prefix]


def _unknown_key(loc: str, value: Any) -> str:
    """``<key>: unknown key``, and what the key is called here (a TRL / verl name) or the near miss."""
    for key in _leaves(loc, value):
        said = hint(key, config_keys())
        if said.startswith(":"):
            return f"{key}: unknown key{said}"
    return f"{loc}: unknown key{hint(loc, config_keys())}"


def _format_validation_error(e: ValidationError) -> str:
    err = e.errors()[0]
    loc = ".".join(str(x) for x in err["loc"])
    msg = err["msg"]
    if err["type"] == "extra_forbidden":
        return _unknown_key(loc, err.get("input"))
    elif msg.startswith("Value error, "):
        msg = msg[len("Value error, "):]
    ctx_err = (err.get("ctx") or {}).get("error")
    if isinstance(ctx_err, _KeyError):
        return f"{ctx_err.key}: {ctx_err.msg}"
    got = err.get("input")
    suffix = f" (got {got!r})" if err["type"] != "extra_forbidden" and not isinstance(got, (dict, list)) else ""
    return f"{loc or '<root>'}: {msg}{suffix}"


def config_from_dict(data: dict[str, Any]) -> Config:
    """The config of ``data``; every adapter's config is checked too (``adapters:``)."""
    cfg = _validated(data)
    adapter_configs(cfg)
    return cfg


def _validated(data: dict[str, Any], prefix: str = "") -> Config:
    try:
        return Config.model_validate(data)
    except ValidationError as e:
        raise ConfigError(prefix + _format_validation_error(e)) from None
    except _KeyError as e:
        raise ConfigError(f"{prefix}{e.key}: {e.msg}") from None


def adapter_configs(cfg: Config) -> dict[str, Config]:
    """``{name: config}`` of every adapter of ``adapters:``, in their order ({} for a run of one
    adapter); a problem is one ``ConfigError`` naming ``adapters.NAME.<key>``."""
    if not cfg.adapters:
        return {}
    check_fleet(cfg)
    base = cfg.model_dump(mode="json", exclude={"adapters"})
    base["reward"]["functions"] = [f.model_dump() for f in cfg.reward.functions]  # a Python callable stays itself
    out: dict[str, Config] = {}
    for i, entry in enumerate(cfg.adapters):
        name, over = check_entry(i, entry)
        if name in out:
            raise ConfigError(f"adapters.{name}: two adapters have this name")
        out[name] = _validated(derive(base, name, over, cfg.output_dir), prefix=f"adapters.{name}.")
    try:
        check_shared(out)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    return out



def load_config(path: str | Path | None = None, overrides: list[str] | dict[str, Any] | None = None,
                sweep: list[str] | None = None) -> Config:
    """Load ``path`` (YAML) and apply overrides and ``--sweep`` flags; raise ConfigError (one line)
    on any problem."""
    data: dict[str, Any] = {}
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"--config: file not found: {p}")
        try:
            data = yaml.safe_load(p.read_text()) or {}
        except yaml.YAMLError as e:
            mark = getattr(e, "problem_mark", None)
            where = f" line {mark.line + 1}" if mark else ""
            raise ConfigError(f"--config: invalid YAML in {p}{where}") from None
        if not isinstance(data, dict):
            raise ConfigError(f"--config: {p} must hold a mapping at the top level")
    if overrides:
        over = parse_overrides(overrides) if isinstance(overrides, list) else overrides
        data = _merge(data, over)
    if sweep:
        if data.get("adapters"):
            raise ConfigError("--sweep: the config lists adapters already; sweep a config of one adapter")
        data = {**data, "adapters": sweep_adapters(sweep)}
    return config_from_dict(data)


def dump_config(cfg: Config) -> str:
    return yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False)
