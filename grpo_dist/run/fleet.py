"""A run of several adapters (issue 53): one set of actors, one ``Run`` per adapter.

The fleet starts Ray and the actors once, from the run's config: the engines (which switch between
adapters, ``rollout/worker.py``), the reward actors (each adapter's functions) and the learner ranks
(the base held once, an engine per adapter: ``learner/adapters.py``). Each adapter is a ``Run`` of
its own -- its config, data stream, rewards, checkpoints, W&B run, ``summary.json``, under
``output_dir/adapters/NAME`` -- that drives the shared actors through views which add
``adapter=NAME`` to its calls (``cluster/adapter_view.py``). Dead engines and reward actors are
replaced once, for every adapter (one ``Recovery``; each adapter's newest weights then reach the
replacement). ``train.train_adapters`` steps the adapters in turn.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Optional

from grpo_dist.cluster.adapter_view import (LEARNER_METHODS, REWARD_METHODS, ROLLOUT_METHODS, AdapterActor,
                                            AdapterView)
from grpo_dist.cluster.ray_utils import init_ray
from grpo_dist.cluster.recovery import Recovery
from grpo_dist.cluster.shared_dir import check_storage
from grpo_dist.config import Config
from grpo_dist.run.inputs import resolve_inputs
from grpo_dist.run.outputs import resolve_outputs
from grpo_dist.run.run import Run, start_block
from grpo_dist.run.workers import Workers, start_workers, startup_times
from grpo_dist.util.disk import write_atomic


class Fleet:
    """The shared actors and the adapters' runs (``runs``: name -> Run, in the config's order)."""

    def __init__(self, cfg: Config, adapters: dict[str, Config], callbacks: tuple = ()):
        self.cfg = resolve_outputs(resolve_inputs(cfg), write=False)
        self.out = Path(self.cfg.output_dir)
        self.adapter_cfgs = adapters
        self.runs: dict[str, Run] = {name: Run(acfg, callbacks=callbacks, fleet=self, name=name)
                                     for name, acfg in adapters.items()}
        self.workers: Optional[Workers] = None
        self.recovery: Optional[Recovery] = None
        self.info: dict[str, Any] = {}
        self.startup: dict[str, float] = {}
        self.stop_requested: Optional[str] = None

    # ------------------------------------------------------------------ what the CLI reads
    @property
    def step(self) -> int:
        """The fewest steps any adapter has finished (the signal handler's "after step N")."""
        return min((r.step for r in self.runs.values()), default=0)

    def request_stop(self, why: str) -> None:
        self.stop_requested = why
        for run in self.runs.values():
            run.request_stop(why)

    # ------------------------------------------------------------------ the actors
    def start(self) -> None:
        """Ray and every actor, once (each adapter's ``Run.start`` calls it)."""
        if self.workers is not None:
            return
        cfg = self.cfg
        self.out.mkdir(parents=True, exist_ok=True)
        init_ray(cfg)
        check_storage(cfg)
        for line in start_block(cfg, self.out):
            print(line, flush=True)
        print(f"adapters  {len(self.runs)} on one base: {', '.join(self.runs)} (each under "
              f"{self.out / 'adapters'}/NAME)", flush=True)
        t0 = time.perf_counter()
        self.workers, self.info = start_workers(cfg, self.adapter_cfgs)
        self.startup, line = startup_times(self.info, time.perf_counter() - t0)
        print(line, flush=True)
        self.recovery = Recovery(cfg, self.workers, on_replace=self._on_replace)

    def workers_for(self, name: str) -> Workers:
        """The actors as adapter ``name`` drives them."""
        assert self.workers is not None, "Fleet.start() first"
        w = self.workers
        return Workers(AdapterView(w.rollout, name, ROLLOUT_METHODS), AdapterView(w.reward, name, REWARD_METHODS),
                       AdapterView(w.learner, name, LEARNER_METHODS))

    def _on_replace(self, rank: int, actor: Any, timeout: float | None = None) -> None:
        """A replaced engine gets every adapter's newest weights (kept; loaded as each is asked for)."""
        for name, run in self.runs.items():
            sync = getattr(run, "sync", None)
            if sync is not None:
                sync.on_replace(rank, AdapterActor(actor, name, ROLLOUT_METHODS), timeout)

    def close(self) -> None:
        for run in self.runs.values():
            run.close()
        if self.workers is not None:
            self.workers.close(quick=bool(self.stop_requested))
            self.workers = None

    # ------------------------------------------------------------------ the end
    def write_summary(self, summaries: dict[str, dict], failed: dict[str, str]) -> dict[str, Any]:
        """``output_dir/summary.json``: every adapter's headline figures side by side, and which failed."""
        keys = ("steps", "wall_seconds", "sampled_accuracy_before", "sampled_accuracy_after",
                "greedy_accuracy_before", "greedy_accuracy_after", "mean_reward_before", "mean_reward_after")
        out = {"adapters": {name: {k: s.get(k) for k in keys if k in s} | {"summary": str(self.out / "adapters" / name
                                                                                        / "summary.json")}
                            for name, s in summaries.items()},
               "failed": failed, "startup": self.startup,
               "peak_rss_gib": self.workers.peak_rss_gib() if self.workers is not None else {}}
        write_atomic(self.out / "summary.json", json.dumps(out, indent=2, default=str))
        return out
