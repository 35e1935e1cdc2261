"""``grpo-dist eval``: the base model and (optionally) an adapter on held-out prompts, through the
same vLLM rollout workers and reward workers training uses. Writes a JSON report and a W&B table;
the CLI prints the base / adapter / delta table (``eval_table.py``).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from grpo_dist.config import Config, ConfigError


def _say(line: str) -> None:
    print(line, flush=True)


class _Engines:
    """The rollout and reward workers, started on first use: a recorded base evaluation needs none."""

    def __init__(self, cfg: Config):
        self.cfg, self.groups = cfg, None

    def get(self) -> tuple[Any, Any]:
        from grpo_dist.cluster.ray_utils import init_ray, worker_log_path
        from grpo_dist.run.workers import create_generators

        if self.groups is None:
            cfg, c = self.cfg, self.cfg.cluster
            init_ray(cfg)
            t0 = time.perf_counter()
            print(f"starting {cfg.rollout.num_workers} {cfg.rollout.backend} engine(s) on {cfg.model.path}"
                  + ("" if cfg.logging.verbose else f" (their logs: {worker_log_path(cfg)})") + " ...", flush=True)
            self.groups = rollout, reward = create_generators(cfg)
            rollout.get(rollout.call("setup"), timeout=c.actor_start_timeout_s)
            reward.get(reward.call("names"), timeout=c.actor_start_timeout_s)
            print(f"engines ready in {time.perf_counter() - t0:.0f} s", flush=True)
        return self.groups

    def close(self) -> None:
        """Engines release their processes and adapter dirs (after a run that went well)."""
        if self.groups is not None:
            rollout = self.groups[0]
            rollout.get(rollout.call("close"))

    def kill(self) -> None:
        from grpo_dist.cluster.ray_utils import shutdown_ray

        if self.groups is not None:
            for group in self.groups:
                group.kill()
            shutdown_ray()


def run_eval(cfg: Config, adapter: str | None, out: str | None = None) -> dict[str, Any]:
    from grpo_dist.run.adapter_check import check_adapter
    from grpo_dist.run.eval_cache import base_evaluation
    from grpo_dist.run.evaluation import eval_metrics, evaluate_sets
    from grpo_dist.run.preflight import extra_eval_sets, prepared_data

    _, records = prepared_data(cfg)  # the held-out prompts training would evaluate on
    if not records:
        raise ConfigError("data.eval_path: evaluation needs held-out prompts")
    extra = extra_eval_sets(cfg)  # eval.extra: more held-out sets, each evaluated the same way
    more = "".join(f" + {len(v)} of {k}" for k, v in extra.items())
    if adapter:  # made for this base model (its modules, their shapes): before any engine starts
        check_adapter(adapter, cfg.model.path)
    engines = _Engines(cfg)

    def evaluate_base(samples: int) -> dict[str, Any]:
        rollout, reward = engines.get()
        print(f"evaluating the base model on {len(records)} held-out prompts{more} ...", flush=True)
        return evaluate_sets(cfg, rollout, reward, records, extra, with_samples=samples, progress=_say)

    try:
        report: dict[str, Any] = {"model": cfg.model.path, "adapter": adapter, "eval_path": cfg.data.eval_path,
                                  **({"eval_extra": dict(cfg.eval.extra)} if extra else {}),
                                  "base": base_evaluation(cfg, records, extra, evaluate_base, "grpo-dist eval", _say)}
        if adapter:
            rollout, reward = engines.get()
            print(f"evaluating the adapter {adapter} ...", flush=True)
            rollout.get(rollout.call("load_adapter_dir", str(Path(adapter).resolve()), 1))
            report["adapter_eval"] = evaluate_sets(cfg, rollout, reward, records, extra, with_samples=8,
                                                   progress=_say)
            base = eval_metrics(report["base"])
            report["delta"] = {k.split("/", 1)[1]: v - base[k] for k, v in eval_metrics(report["adapter_eval"]).items()}
        engines.close()
    finally:
        engines.kill()
    path = (Path(out) if out else Path(cfg.output_dir) / "eval_report.json").absolute()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2, default=float))
    report["report_path"] = str(path)
    _log_wandb(cfg, report, eval_metrics)
    return report


def _log_wandb(cfg: Config, report: dict[str, Any], eval_metrics) -> None:
    if cfg.logging.wandb_mode == "disabled":
        return
    from grpo_dist.run.monitor import WandbMonitor

    cfg = cfg.model_copy(deep=True)
    cfg.trainer.run_id = None  # a W&B run of its own, never a segment of the training run it evaluates
    wb = WandbMonitor.from_config(cfg, default_name="eval", config={"eval": report["adapter"]})
    rows = []
    for which in ("base", "adapter_eval"):
        if which in report:
            wb.log({f"{which}/{k}": v for k, v in eval_metrics(report[which]).items()}, step=0)
            sets = [("main", report[which]), *report[which].get("extra", {}).items()]  # eval.extra after the main set
            for set_name, rep in sets:
                for s in rep.get("samples", []):
                    n_correct = sum(s["correct"]) if s["correct"] is not None else None  # None: no accuracy reward
                    rows.append([which, set_name, s["prompt"], s["answer"], " | ".join(s["completions"]), n_correct])
    wb.log_table("eval_samples", ["policy", "set", "prompt", "answer", "completions", "n_correct"], rows, step=0)
    report["wandb_dir"] = wb.run_dir
    wb.close()
