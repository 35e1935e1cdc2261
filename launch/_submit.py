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

The job server is asked first, without a token, whether it needs one (GET /api/version answers
401 or 403 under token authentication). If it does, the cluster token (RAY_AUTH_TOKEN, else the
file RAY_AUTH_TOKEN_PATH, default ~/.ray/auth_token) authenticates the submission and, with
WANDB_API_KEY, travels to the driver in the job's environment through a private temporary file,
never on a command line (`ps` shows those to every local user) and never printed; no token here:
exit 2. If it does not (a cluster that takes any client: `ray start`'s and KubeRay's default), one
warning line says so and no token is sent (every client can read an open cluster's job records).
Nothing here weakens a cluster: start_head.sh starts token clusters only.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
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


def needs_token(address: str) -> bool:
    """Whether the job server at ``address`` refuses a request without a token (token authentication
    on); one line and exit 2 when nothing answers there."""
    if not address.startswith(("http://", "https://")):
        print(f"submit_job.sh: RAY_ADDRESS={address} is not a Ray job server's address (http://HEAD:8265)",
              file=sys.stderr)
        raise SystemExit(2)
    try:
        with urllib.request.urlopen(address.rstrip("/") + "/api/version", timeout=30):
            return False
    except urllib.error.HTTPError as e:
        if e.code in (401, 403):
            return True
        why = f"HTTP {e.code} {e.reason}"
    except (OSError, ValueError) as e:
        why = str(getattr(e, "reason", None) or e)
    print(f"submit_job.sh: no Ray job server at {address} ({why}); set RAY_ADDRESS to the head's dashboard "
          f"address (from another machine through an SSH tunnel: ssh -N -L 8265:127.0.0.1:8265 user@head)",
          file=sys.stderr)
    raise SystemExit(2)


def find_token() -> tuple[str, dict[str, str]]:
    """The cluster token and the variables that let Ray's job CLI send it; exit 2 without one."""
    if os.environ.get("RAY_AUTH_TOKEN"):
        return os.environ["RAY_AUTH_TOKEN"], {}
    path = Path(os.environ.get("RAY_AUTH_TOKEN_PATH") or Path.home() / ".ray" / "auth_token").expanduser()
    token = path.read_text().strip() if path.is_file() else ""
    if not token:
        print(f"submit_job.sh: the cluster needs a token and there is no cluster token at {path}: set "
              f"RAY_AUTH_TOKEN_PATH to a copy of the head's token file (start_head.sh says where it is)",
              file=sys.stderr)
        raise SystemExit(2)
    try:
        path.chmod(0o600)
    except OSError:
        pass
    return token, {"RAY_AUTH_TOKEN_PATH": str(path)}


def job_env(token: str | None) -> dict[str, str]:
    env = {"HF_HUB_OFFLINE": os.environ.get("HF_HUB_OFFLINE", "0"),  # the hub unless offline here
           # relative paths (output_dir, model.path, data) resolve against this directory, not Ray's copy
           "GRPO_DIST_SUBMIT_DIR": os.getcwd()}
    if token:
        env.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=token)
    if os.environ.get("WANDB_API_KEY"):
        env["WANDB_API_KEY"] = os.environ["WANDB_API_KEY"]
    return env


def main(argv: list[str]) -> int:
    if not argv:
        print("usage: submit_job.sh CONFIG [--section.key VALUE ...]", file=sys.stderr)
        return 2
    cfg_path, overrides = argv[0], argv[1:]
    cwd = Path.cwd()
    address = os.environ.setdefault("RAY_ADDRESS", "http://127.0.0.1:8265")
    if needs_token(address):
        token, cli_env = find_token()
        cli_env["RAY_AUTH_MODE"] = "token"  # Ray's job CLI sends the token only in token mode
    else:
        token, cli_env = None, {"RAY_AUTH_MODE": "disabled"}  # and so sends none here
        print(f"warning: the Ray cluster at {address} takes any client (no token authentication): whoever reaches "
              f"its ports can run code on its nodes and read the job's environment; submitting without a token "
              f"(a cluster with token authentication: launch/start_head.sh, docs/security.md)", file=sys.stderr,
              flush=True)
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
        env_file.write_text(json.dumps({"env_vars": job_env(token)}))  # JSON is YAML: --runtime-env reads it
        env_file.chmod(0o600)
        cmd = ["ray", "job", "submit", "--working-dir", str(work), "--runtime-env", str(env_file), "--",
               "python", "-m", "grpo_dist.cli", "train", "--config", job_cfg, "--cluster.address", "auto", *overrides]
        return subprocess.run(cmd, env={**os.environ, **cli_env}).returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
