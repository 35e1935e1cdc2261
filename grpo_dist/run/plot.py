"""``grpo-dist plot RUN_DIR``: a run's curves as one PNG, from its own files (``metrics.jsonl``,
``summary.json``): is it learning?

Panels: the training reward per step (the total and each reward function's mean; the held-out
accuracy before and after training as two marks, when the run evaluated); the completion length
and the truncated fraction; the seconds per step split into generate / learn / sync (and score).
matplotlib is imported here only (``pip install matplotlib``; ``make setup`` installs it).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from grpo_dist.run.outputs import METRICS_FILE, read_metrics

STAGES = ("timing/generate", "timing/score", "timing/learn", "timing/sync")


class PlotError(ValueError):
    """A run directory that has nothing to plot (one line for the CLI)."""


def load_run(run_dir: str | Path) -> tuple[list[dict[str, float]], dict[str, Any]]:
    """The per-step metrics and the summary (``{}`` while the run is going) of ``run_dir``."""
    run_dir = Path(run_dir)
    if not (run_dir / METRICS_FILE).is_file():
        raise PlotError(f"{run_dir} has no {METRICS_FILE}: not a run directory of grpo-dist train, or no step "
                        f"finished yet")
    history = read_metrics(run_dir)
    if not history:
        raise PlotError(f"{run_dir / METRICS_FILE} is empty: no step finished yet")
    summary_path = run_dir / "summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.is_file() else {}
    return history, summary


def _series(history: list[dict[str, float]], key: str) -> tuple[list[float], list[float]]:
    pts = [(h["step"], h[key]) for h in history if key in h]
    return [p[0] for p in pts], [p[1] for p in pts]


def plot_run(run_dir: str | Path, out: str | Path | None = None, title: str | None = None) -> Path:
    """Write the run's curves to ``out`` (default ``RUN_DIR/curves.png``); returns the path."""
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    history, summary = load_run(run_dir)
    out = Path(out) if out else Path(run_dir) / "curves.png"
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    ax = axes[0]
    ax.plot(*_series(history, "rollout/reward_mean"), label="reward (weighted total)", color="black", lw=2)
    for key in sorted(k for k in history[-1] if k.startswith("reward/") and k.count("/") == 1):
        ax.plot(*_series(history, key), label=key.split("/", 1)[1], lw=1)
    steps = history[-1]["step"]
    for when, x, marker in (("before", 0, "o"), ("after", steps, "s")):
        acc = summary.get(f"sampled_accuracy_{when}")
        if acc is not None:
            ax.plot([x], [acc], marker=marker, color="tab:red", ls="none", ms=8,
                    label=f"held-out sampled accuracy {when}: {acc:.3f}")
    ax.set(xlabel="step", ylabel="mean reward / accuracy", title="reward per step")
    ax.legend(fontsize=7)
    ax = axes[1]
    ax.plot(*_series(history, "rollout/completion_length_mean"), label="completion tokens (mean)", color="tab:blue")
    ax.set(xlabel="step", ylabel="tokens", title="completions")
    twin = ax.twinx()
    twin.plot(*_series(history, "rollout/truncated_frac"), label="truncated fraction", color="tab:orange")
    twin.set(ylabel="fraction", ylim=(0, 1))
    ax.legend(loc="upper left", fontsize=7)
    twin.legend(loc="upper right", fontsize=7)
    ax = axes[2]
    x = [h["step"] for h in history]
    bottom = [0.0] * len(history)
    for key in STAGES:
        vals = [h.get(key, 0.0) for h in history]
        if any(vals):
            ax.bar(x, vals, bottom=bottom, label=key.split("/")[1], width=0.8)
            bottom = [b + v for b, v in zip(bottom, vals)]
    ax.set(xlabel="step", ylabel="seconds", title="seconds per step")
    ax.legend(fontsize=7)
    fig.suptitle(title or str(run_dir), fontsize=10)
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out
