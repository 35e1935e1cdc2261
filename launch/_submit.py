"""launch/submit_job.sh's Python half: ship what the job needs, and nothing else, then `ray job submit`.

  _submit.py CONFIG [--section.key VALUE ...]

The job's working dir is a fresh staging directory holding exactly:
  - grpo_dist/ (this checkout's code, without __pycache__),
  - the config file (at its relative path; one outside this directory under its file name),
  - the plug-in files the config names (reward functions, environments: 'file.py:attr', or a
    'module:attr' whose module is a file or package in this directory),
  - the paths in GRPO_DIST_SUBMIT_INCLUDE (space-separated, relative to this directory).
It prints that list before submitting. Nothing else of the current directory travels (logs, token
files, runs, models, data): the job reads a relative model.path or data path, and writes a
relative output_dir, in this directory (GRPO_DIST_SUBMIT_DIR; grpo_dist/run/inputs.py, outputs.py).

The cluster token (RAY_AUTH_TOKEN or the file RAY_AUTH_TOKEN_PATH, found by _token.sh) and
WANDB_API_KEY travel to the driver in the job's environment through a private temporary file,
never on a command line (`ps` shows those to every local user) and never printed.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
_SPEC = re.compile(r"([^\s:]+):([A-Za-z_][\w.]*)")


def _strings(tree):
    if isinstance(tree, dict):
        for v in tree.values():
            yield from _strings(v)
    elif isinstance(tree, list):
        for v in tree:
            yield from _strings(v)
    elif isinstance(tree, str):
        yield tree


def plugin_paths(cfg_tree: dict, cwd: Path) -> list[tuple[str, str]]:
    """(relative path, why) of every local plug-in file or package the config names."""
    found: dict[str, str] = {}
    for s in _strings(cfg_tree):
        m = _SPEC.fullmatch(s)
        if not m:
            continue
        target = m.group(1)
        if target.endswith(".py") or "/" in target:
            p = Path(target).expanduser()
            if not p.is_absolute() and (cwd / p).is_file():
                found.setdefault(str(p), f"plug-in file of {s!r}")
            continue
        top = target.split(".")[0]
        if top == "grpo_dist":
            continue
        if (cwd / top / "__init__.py").is_file():
            found.setdefault(top, f"plug-in package of {s!r}")
        elif (cwd / (target.replace(".", "/") + ".py")).is_file():
            found.setdefault(target.replace(".", "/") + ".py", f"plug-in module of {s!r}")
    return sorted(found.items())


def _size(path: Path) -> tuple[int, int]:
    files = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]
    return len(files), sum(p.stat().st_size for p in files)


def stage(cfg_path: str, overrides: list[str], out: Path, cwd: Path) -> tuple[str, list[tuple[str, str]]]:
    """Fill ``out`` with what the job needs; returns (the config's path in it, [(path, why)])."""
    sys.path.insert(0, str(REPO))
    from grpo_dist.config import ConfigError, load_config

    try:
        cfg = load_config(cfg_path, overrides)
    except ConfigError as e:
        print(f"config error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(REPO / "grpo_dist", out / "grpo_dist", ignore=ignore)
    items = [("grpo_dist", "the code")]
    rel = Path(cfg_path)
    inside = not rel.is_absolute() and ".." not in rel.parts
    job_cfg = str(rel) if inside else rel.name
    (out / job_cfg).parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(cfg_path, out / job_cfg)
    items.append((job_cfg, "the config"))
    extra = [(p, "GRPO_DIST_SUBMIT_INCLUDE") for p in os.environ.get("GRPO_DIST_SUBMIT_INCLUDE", "").split()]
    for p, why in plugin_paths(cfg.model_dump(mode="json"), cwd) + extra:
        src = cwd / p
        if Path(p).is_absolute() or ".." in Path(p).parts or not src.exists():
            print(f"submit_job.sh: {p} ({why}): not a path inside {cwd}", file=sys.stderr)
            raise SystemExit(2)
        dst = out / p
        dst.parent.mkdir(parents=True, exist_ok=True)
        if src.is_dir():
            shutil.copytree(src, dst, ignore=ignore, dirs_exist_ok=True)
        else:
            shutil.copy2(src, dst)
        items.append((p, why))
    return job_cfg, items


def job_env() -> dict[str, str]:
    token = os.environ.get("RAY_AUTH_TOKEN") or Path(os.environ["RAY_AUTH_TOKEN_PATH"]).read_text().strip()
    env = {"HF_HUB_OFFLINE": os.environ.get("HF_HUB_OFFLINE", "0"),  # the hub unless offline here
           "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token,
           # relative paths (output_dir, model.path, data) resolve against this directory, not Ray's copy
           "GRPO_DIST_SUBMIT_DIR": os.getcwd()}
    if os.environ.get("WANDB_API_KEY"):
        env["WANDB_API_KEY"] = os.environ["WANDB_API_KEY"]
    return env


def main(argv: list[str]) -> int:
    if not argv:
        print("usage: submit_job.sh CONFIG [--section.key VALUE ...]", file=sys.stderr)
        return 2
    cfg_path, overrides = argv[0], argv[1:]
    cwd = Path.cwd()
    with tempfile.TemporaryDirectory(prefix="grpo_dist_job_") as tmp:
        work = Path(tmp) / "working_dir"
        work.mkdir()
        job_cfg, items = stage(cfg_path, overrides, work, cwd)
        print(f"uploading to the job's working dir (nothing else of {cwd}; relative model, data and output "
              f"paths are read and written there, on the job's node):")
        total_n = total_b = 0
        for p, why in items:
            n, b = _size(work / p)
            total_n, total_b = total_n + n, total_b + b
            shown = p + "/" if (work / p).is_dir() else p
            print(f"  {shown:40s} {why}" + (f" ({n} files, {b / 1024:.0f} kB)" if n > 1 else f" ({b / 1024:.1f} kB)"))
        print(f"  {total_n} files, {total_b / 1024:.0f} kB in all", flush=True)
        env_file = Path(tmp) / "runtime_env.json"  # the directory is private (mode 700)
        env_file.write_text(json.dumps({"env_vars": job_env()}))  # JSON is YAML: --runtime-env reads it
        env_file.chmod(0o600)
        cmd = ["ray", "job", "submit", "--working-dir", str(work), "--runtime-env", str(env_file), "--",
               "python", "-m", "grpo_dist.cli", "train", "--config", job_cfg, "--cluster.address", "auto", *overrides]
        return subprocess.run(cmd).returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
