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


def run_eval(cfg: Config, adapter: str | None, out: str | None = None) -> dict[str, Any]:
    from grpo_dist.run.workers import create_generators
    from grpo_dist.cluster.ray_utils import init_ray, shutdown_ray, worker_log_path
    from grpo_dist.run.evaluation import eval_metrics, evaluate_sets
    from grpo_dist.run.adapter_check import check_adapter
    from grpo_dist.run.preflight import extra_eval_sets, prepared_data

    _, records = prepared_data(cfg)  # the held-out prompts training would evaluate on
    if not records:
        raise ConfigError("data.eval_path: evaluation needs held-out prompts")
    extra = extra_eval_sets(cfg)  # eval.extra: more held-out sets, each evaluated the same way
    more = "".join(f" + {len(v)} of {k}" for k, v in extra.items())
    if adapter:  # made for this base model (its modules, their shapes): before any engine starts
        check_adapter(adapter, cfg.model.path)
    init_ray(cfg)
    c = cfg.cluster
    t0 = time.perf_counter()
    print(f"starting {cfg.rollout.num_workers} {cfg.rollout.backend} engine(s) on {cfg.model.path}"
          + ("" if cfg.logging.verbose else f" (their logs: {worker_log_path(cfg)})") + " ...", flush=True)
    rollout, reward = create_generators(cfg)
    try:
        rollout.get(rollout.call("setup"), timeout=c.actor_start_timeout_s)
        reward.get(reward.call("names"), timeout=c.actor_start_timeout_s)
        print(f"engines ready in {time.perf_counter() - t0:.0f} s; evaluating the base model on {len(records)} "
              f"held-out prompts{more} ...", flush=True)
        report: dict[str, Any] = {"model": cfg.model.path, "adapter": adapter, "eval_path": cfg.data.eval_path,
                                  **({"eval_extra": dict(cfg.eval.extra)} if extra else {}),
                                  "base": evaluate_sets(cfg, rollout, reward, records, extra, with_samples=8,
                                                        progress=_say)}
        if adapter:
            print(f"evaluating the adapter {adapter} ...", flush=True)
            rollout.get(rollout.call("load_adapter_dir", str(Path(adapter).resolve()), 1))
            report["adapter_eval"] = evaluate_sets(cfg, rollout, reward, records, extra, with_samples=8,
                                                   progress=_say)
            base = eval_metrics(report["base"])
            report["delta"] = {k.split("/", 1)[1]: v - base[k] for k, v in eval_metrics(report["adapter_eval"]).items()}
        rollout.get(rollout.call("close"))
    finally:
        rollout.kill()
        reward.kill()
        shutdown_ray()
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
