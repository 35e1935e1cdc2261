"""``benchmarks/gpu_e2e.py`` (``make gpu-e2e``): the table's check and, marked ``gpu`` (skipped without
CUDA), the four settings on the GPU with the tiny models, so the GPU call fails first on what is
really GPU-specific. Its CPU dry run runs inside the GPU lease's rehearsal (tests/test_gpu_lease.py)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest
import torch
from scripts import load_script

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "benchmarks", "gpu_e2e.py")


def _env() -> dict[str, str]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]))
    env.pop("WANDB_SERVICE", None)  # a W&B service of this pytest process must not serve the runs
    return env


def _script():
    return load_script(SCRIPT)


def _check_table(doc: dict, settings: set[str], models: set[str]) -> None:
    cols = doc["columns"]
    assert {"s_per_step", "generate", "reference", "update", "sync", "sleep", "wake", "tokens_per_s", "mfu",
            "learner_tflops", "logprob_diff_max", "startup", "startup_engine", "startup_learner", "other", "sync_publish", "sync_transfer", "peak_gib_learner", "peak_gib_rollout", "peak_gib_reward"} <= set(cols)
    assert {r["setting"] for r in doc["rows"]} == settings and {r["model"] for r in doc["rows"]} == models
    for r in doc["rows"]:
        assert r["rc"] == 0, r
        for c in cols:
            if c not in r["not_applicable"]:
                assert isinstance(r[c], float) and math.isfinite(r[c]), (r["setting"], c, r[c])
        assert r["s_per_step"] > 0 and r["tokens_per_s"] > 0 and 0 < r["mfu"] and r["peak_gib_rollout"] > 0
        assert 0 < r["startup"] < r["wall_s"], (r["startup"], r["wall_s"])
        assert 0 < r["startup_engine"] < r["startup"] and 0 < r["startup_learner"] < r["startup"], r
    assert doc["problems"] == []


def test_table_check_reports_what_is_missing():
    """The check the test relies on: a failed run, a missing or non-finite column where it applies
    and a log-prob difference over the tolerance are each a problem; n/a columns are not."""
    mod = _script()
    row = {c: 1.0 for c in mod.COLUMNS}
    row.update(model="smollm2", model_run="tiny", setting="disagg", rc=0, not_applicable=["sleep", "wake"],
               sleep=None, wake=None, logprob_diff_max=2e-6)
    doc = {"rows": [row], "logprob_tol": 1e-3}
    assert mod.check(doc) == []
    bad = [dict(row, update=None), dict(row, mfu=float("nan")), dict(row, logprob_diff_max=0.5), dict(row, rc=1),
           dict(row, not_applicable=[])]
    problems = mod.check({"rows": bad, "logprob_tol": 1e-3})
    assert len(problems) == 6 and any("update = None" in p for p in problems) and any("0.5" in p or "5.00e-01" in p
                                                                                          for p in problems)
    assert "| smollm2 (tiny) | disagg |" in mod.table([row], "RSS")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_settings_on_tiny_models(tmp_path):
    """The four GPU settings (sleep/wake, fractional GPUs, vLLM's LoRA kernels, the collective) with
    the tiny Llama on the GPU, eager engines: what ``make gpu-e2e`` runs next, minus the model sizes
    (a few minutes, so a GPU-specific failure shows before the long runs)."""
    out = tmp_path / "gpu_e2e.json"
    p = subprocess.run([sys.executable, SCRIPT, "--tiny", "--models", "smollm2", "--no-trl", "--steps", "2",
                        "--rollout.enforce_eager", "true", "--json", str(out),
                        "--log-dir", str(tmp_path / "runs")], capture_output=True, text=True, timeout=1500,
                       env=_env(), cwd=ROOT)
    print(p.stdout[-6000:])
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    doc = json.loads(out.read_text())
    _check_table(doc, {"colocated", "disagg", "lora", "collective"}, {"smollm2"})
    assert [r["not_applicable"] for r in doc["rows"] if r["setting"] == "colocated"] == [[]]  # it slept and woke


def test_start_up_is_read_from_the_first_metrics_line_of_this_run_not_an_earlier_ones(tmp_path):
    import time

    sys.path.insert(0, os.path.dirname(SCRIPT))
    import e2e_parts

    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1}\n')
    os.utime(path, (time.time() - 60, time.time() - 60))  # an earlier run's file in the same directory
    with e2e_parts.FirstStep(str(path)) as first:
        time.sleep(0.5)
        assert first.seen is None
        path.write_text('{"step": 1, "timing/step": 0.2}\n')  # this run's first step, 0.2 s long
        time.sleep(0.5)
    assert first.seen is not None and 0.3 <= first.startup_s(0.2) <= 0.9, first.seen
    assert first.startup_s(None) is None
