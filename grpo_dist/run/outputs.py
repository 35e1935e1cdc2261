"""Where a run's outputs go: one absolute ``output_dir`` on the driver's node, and the run id.

Everything a run writes (checkpoints, adapter, summary, trainer state, W&B files, config) is
written by the driver or sent to it (``checkpoint.py``), so this one directory holds the whole run
whatever node each actor ran on.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

from grpo_dist.config import Config, ConfigError, dump_config
from grpo_dist.util.callables import CallableSpec
from grpo_dist.util.disk import append_lines, write_atomic, writing
from grpo_dist.util.paths import user_path

RUN_FILE = "run.json"
def _absolute(path: str, key: str) -> str:
    p = user_path(path)
    if p is None:
        raise ConfigError(f"{key}: the relative path {path!r} would land in Ray's temporary copy of the working "
                          f"dir on the job's node and be lost; give an absolute path (launch/submit_job.sh "
                          f"resolves relative paths against your directory)")
    return str(p)


def resolve_outputs(cfg: Config, write: bool = True) -> Config:
    """A copy of ``cfg`` with absolute ``output_dir`` / ``checkpoint.dir`` and a ``trainer.run_id``
    (the one in ``<output_dir>/run.json`` when resuming, else a new one). A resume is checked
    against its checkpoint first (``checkpoint.check_resume``: ConfigError naming the keys that
    differ). ``write``: write ``run.json`` and ``config.yaml`` now (:func:`write_run_files`; a
    ``Run`` writes them once the pre-flight accepted the config)."""
    from grpo_dist.run.checkpoint import check_resume

    cfg = cfg.model_copy(deep=True)
    cfg.output_dir = _absolute(cfg.output_dir, "output_dir")
    if cfg.checkpoint.dir:
        cfg.checkpoint.dir = _absolute(cfg.checkpoint.dir, "checkpoint.dir")
    check_resume(cfg)  # before anything is written: a refused resume leaves the run's files as they were
    run_file = Path(cfg.output_dir) / RUN_FILE
    if cfg.trainer.run_id is None:
        old = json.loads(run_file.read_text()).get("run_id") if run_file.is_file() else None
        cfg.trainer.run_id = old if (old and cfg.checkpoint.resume) else uuid.uuid4().hex[:12]
    if write:
        write_run_files(cfg)
    return cfg


def code_version() -> dict[str, Any]:
    """The code this process runs: grpo_dist's version and, from a git checkout, its commit and
    whether the tree differs from it (tracked files; none where git or the checkout is missing,
    e.g. a Ray job's copy of the working dir). Two runs scored by different code are not a seed
    pair: session 19 found two runs of one recipe that a reward fix between them had split."""
    import subprocess

    import grpo_dist

    out: dict[str, Any] = {"grpo_dist": getattr(grpo_dist, "__version__", "?")}
    here = Path(grpo_dist.__file__).resolve().parent
    try:
        sha = subprocess.run(["git", "-C", str(here), "rev-parse", "HEAD"], capture_output=True, text=True,
                             timeout=10)
        if sha.returncode == 0:
            dirty = subprocess.run(["git", "-C", str(here), "status", "--porcelain", "--untracked-files=no", "."],
                                   capture_output=True, text=True, timeout=10)
            out.update(commit=sha.stdout.strip(), dirty=bool(dirty.stdout.strip()))
    except (OSError, subprocess.TimeoutExpired):
        pass
    return out


def machine() -> dict[str, Any]:
    """The driver's machine, for the model card of an export: OS, CPU model and count, its GPUs'
    names from ``nvidia-smi`` (torch would make a CUDA context on the driver, holding GPU memory the
    actors need). No hostname: a card may be public."""
    import os
    import platform
    import shutil
    import subprocess

    from grpo_dist.util.cpu import cpu_flags

    out: dict[str, Any] = {"os": platform.platform(terse=True), "cpu": cpu_flags()[0], "cpus": os.cpu_count()}
    if shutil.which("nvidia-smi"):
        try:
            r = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                               text=True, timeout=10)
            if r.returncode == 0 and r.stdout.strip():
                out["gpus"] = [line.strip() for line in r.stdout.splitlines() if line.strip()]
        except (OSError, subprocess.TimeoutExpired):
            pass
    return out


def write_run_files(cfg: Config) -> None:
    """``<output_dir>/run.json`` (the run id, the code and the machine of the latest start:
    ``code_version``, ``machine``) and ``config.yaml`` (what the resume command reads)."""
    out = Path(cfg.output_dir)
    with writing(out):
        out.mkdir(parents=True, exist_ok=True)
    write_atomic(out / RUN_FILE, json.dumps({"run_id": cfg.trainer.run_id, "code": code_version(),
                                             "machine": machine()}, indent=1))
    write_atomic(out / "config.yaml", dump_config(cfg))


METRICS_FILE = "metrics.jsonl"


def write_metrics(out: Path, history: list[dict[str, float]], append: bool = True) -> None:
    """``<out>/metrics.jsonl``: one JSON line of metrics per step (``step`` included), appended as
    each step ends; ``append=False`` writes the file anew (a resumed run: its restored history, so
    the steps after its checkpoint that the earlier segment logged are gone). Whole lines only: a
    write that fails leaves the file as it was and raises ``disk.WriteError``."""
    text = "".join(json.dumps(h, default=float) + "\n" for h in history)
    (append_lines if append else write_atomic)(Path(out) / METRICS_FILE, text)


def read_metrics(out: Path) -> list[dict[str, float]]:
    """The per-step metrics of the run in ``out`` (``metrics.jsonl``)."""
    path = Path(out) / METRICS_FILE
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def resume_command(cfg: Config) -> str:
    """The exact command that continues this run from its newest checkpoint."""
    if any(isinstance(f.fn, CallableSpec) for f in cfg.reward.functions):  # config.yaml has only their names
        return "the same GRPOTrainer(...).train() with GRPOConfig(resume_from_checkpoint=True)"
    return f"grpo-dist train --config {Path(cfg.output_dir) / 'config.yaml'} --checkpoint.resume auto"


def resume_hint(cfg: Config) -> str:
    """Where a stopped run can continue from, and how."""
    from grpo_dist.run.checkpoint import list_checkpoints

    found = list_checkpoints(cfg.checkpoint_dir)
    last = (f"the last checkpoint is {found[-1]} (step {int(found[-1].name.split('_')[1])})" if found
            else f"no checkpoint was written yet (checkpoint.every={cfg.checkpoint.every})")
    return f"{last}; resume with: {resume_command(cfg)}"


def mean_timing(history: list[dict[str, float]]) -> dict[str, float]:
    """Mean seconds per step of each phase (over the steps that had it) and tokens/s."""
    keys = sorted({k for h in history for k in h if k.startswith(("timing/", "perf/"))})
    return {k: sum(h[k] for h in history if k in h) / sum(1 for h in history if k in h) for k in keys}


def write_summary(out: Path, steps: int, wall: float, adapter_dir, wandb_dir, metrics: dict, history: list[dict],
                  before: dict | None, after: dict | None, reward_failures: dict | None = None,
                  extra: dict | None = None) -> dict[str, Any]:
    """``<out>/summary.json``: the whole run (``history`` from step 1, ``wall`` over every segment,
    also after a resume); ``reward_failures``: per reward function, completions scored and failed
    over the whole run; ``extra``: more top-level keys."""
    summary: dict[str, Any] = {"steps": steps, "wall_seconds": wall, "adapter_dir": str(adapter_dir),
                               "wandb_dir": wandb_dir, **(extra or {}), "final_metrics": metrics,
                               "reward_curve": [h.get("rollout/reward_mean") for h in history],
                               "mean_timing": mean_timing(history)}
    if reward_failures is not None:
        summary["reward_failures"] = reward_failures
    for name, rep in (("before", before), ("after", after)):
        if rep is not None:
            for key in ("sampled_accuracy", "greedy_accuracy", "mean_reward"):  # no accuracy without answers
                if key in rep:
                    summary[f"{key}_{name}"] = rep[key]
            summary[f"eval_{name}"] = rep
            for set_name, r in rep.get("extra", {}).items():  # eval.extra: the same keys per set
                one = summary.setdefault("eval_sets", {}).setdefault(set_name, {"source": r.get("source")})
                one.update({f"{k}_{name}": r[k] for k in ("sampled_accuracy", "greedy_accuracy", "mean_reward") if k in r})
    write_atomic(Path(out) / "summary.json", json.dumps(summary, indent=2, default=float))
    return summary


def summary_lines(s: dict) -> list[str]:
    """What `grpo-dist train` prints at the end, from ``summary.json``."""
    out = ["\n=== grpo-dist summary ==="]
    sets = [("", s), *((f"{k}/", v) for k, v in s.get("eval_sets", {}).items())]  # main set, then eval.extra's
    for prefix, one in sets:
        for name in ("sampled_accuracy", "greedy_accuracy"):
            label = f"{prefix}{name}"
            if f"{name}_before" in one and f"{name}_after" in one:
                b, a = one[f"{name}_before"], one[f"{name}_after"]
                out.append(f"{label:18s} before {b:.3f}  after {a:.3f}  ({a - b:+.3f})")
            elif f"{name}_after" in one:  # eval.before: false
                out.append(f"{label:18s} after {one[f'{name}_after']:.3f}")
    segs = f" over {s['segments']} segments" if s.get("segments", 1) > 1 else ""
    early = "  (trainer.max_minutes reached)" if s.get("stopped") == "max_minutes" else ""
    out.append(f"steps {s['steps']}  wall {s['wall_seconds']:.0f} s{segs}{early}")
    if s.get("peak_rss_gib"):
        out.append("peak RSS  " + ", ".join(f"{role} {gib:.1f} GiB" for role, gib in s["peak_rss_gib"].items())
                   + "  (each role's largest actor, its child processes included)")
    if s.get("hosts"):
        out.append("hosts     " + ", ".join(f"{role} {' '.join(ips)}" for role, ips in s["hosts"].items()))
    failed = {k: v for k, v in s.get("reward_failures", {}).items() if v["failed"]}
    for name, v in failed.items():  # under reward.max_failure_rate (else the run did not succeed)
        out.append(f"reward function {name!r} failed on {v['failed']} of {v['scored']} completions ({v['rate']:.1%}): "
                   f"{v.get('first_failure', '')}")
    out.append(f"adapter   {s['adapter_dir']}")
    if s.get("wandb_sync"):  # every segment of a resumed run
        out.append(f"wandb     {s['wandb_dir']}  (offline; upload: `{s['wandb_sync']}`)")
    elif s.get("wandb_dir"):
        out.append(f"wandb     {s['wandb_dir']}")
    return out


def adapters_table(overall: dict) -> list[str]:
    """The end of a run of several adapters: a row per adapter (steps, accuracy and reward before
    -> after), then the ones that stopped early."""
    def fig(s: dict, key: str) -> str:
        a, b = s.get(f"{key}_before"), s.get(f"{key}_after")
        return "-" if a is None and b is None else f"{a if a is None else f'{a:.3f}'} -> {b if b is None else f'{b:.3f}'}"

    rows = [(name, str(s.get("steps", "-")), fig(s, "sampled_accuracy"), fig(s, "greedy_accuracy"),
             fig(s, "mean_reward")) for name, s in overall.get("adapters", {}).items()]
    rows += [(name, "stopped", "-", "-", "-") for name in overall.get("failed", {})]
    head = ("adapter", "steps", "sampled acc", "greedy acc", "mean reward")
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    line = lambda r: "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip()  # noqa: E731
    return ["\n=== grpo-dist adapters ===", line(head), *map(line, rows)]
