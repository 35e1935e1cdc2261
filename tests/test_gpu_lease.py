"""``benchmarks/gpu_lease.py`` (``make gpu-lease``): the GPU lease's one prepared command. Its CPU
rehearsal (slow: the real ``grpo-dist train`` entry, Ray, vLLM's CPU build, reward actors, the
DeepSpeed learner, every sync setting, through gpu_e2e's dry run) under the lease's deadline and
JSON; a hanging row killed on time with the rows before it kept; the pieces joined as staged."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import psutil
import pytest
from test_gpu_e2e import _check_table, _env
from scripts import load_script

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "benchmarks", "gpu_lease.py")


def _lease():
    return load_script(SCRIPT)


@pytest.mark.slow
@pytest.mark.heavy  # make test-all, and run by hand before every lease (docs/development.md): 150 s of three runs; the
# lease's deadline, killed rows and targets stay in make test (the tests below), gpu_e2e's table check in
# test_gpu_e2e.py, and each setting on CPU in its own test (colocated: test_learners_ray; collective)
@pytest.mark.budget(300)  # 129-150 s on 2 cores (2026-11-28): three grpo-dist train runs, each its own cluster
def test_dry_run_fills_every_setting_and_column_under_the_lease(tmp_path):
    """The rehearsal: the GPU-specific settings (colocated and LoRA on the tiny Llama, full weights over the
    collective on the tiny Qwen2), as gpu_e2e's dry run, run by the lease: finite
    numbers in every column that applies (start-up included), each row naming what the dry run
    substituted, vLLM vs learner log-probs within the tolerance; lease.json with the stages, the row
    and every target (none measured on CPU)."""
    out = tmp_path / "lease"
    p = subprocess.run([sys.executable, SCRIPT, "run", "--dry-run", "--out", str(out), "--budget-s", "1600"],
                       capture_output=True, text=True, timeout=1700, env=_env(), cwd=ROOT)
    print(p.stdout[-6000:])
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    lease = json.loads((out / "lease.json").read_text())
    assert lease["dry_run"] and lease["plan"] == "dry" and lease["stages"]["install"]["seconds"] == 0.0
    [row] = lease["rows"]
    assert row["status"] == "done" and row["wall_s"] > 0 and (out / row["log"]).is_file()
    doc = row["table"]
    _check_table(doc, {"colocated", "lora", "collective"}, {"smollm2", "qwen2-0.5b"})
    assert doc["dry_run"] and doc["logprob_tol"] == 1e-3
    assert all(r["substituted"] and r["model_run"] in ("tiny", "tiny-qwen2") for r in doc["rows"])
    assert all(r["logprob_diff_max"] <= 1e-3 for r in doc["rows"])
    assert {r["model_run"] for r in doc["rows"] if r["setting"] == "collective"} == {"tiny-qwen2"}
    # the engine never sleeps on CPU: sleep and wake are not applicable anywhere in the dry run
    assert all(r["not_applicable"] == ["sleep", "wake"] + (["sync_publish", "sync_transfer"] if r["setting"] ==
                                                           "collective" else []) for r in doc["rows"])
    # every second of a step inside a named timer: the untimed rest is a small part of it
    assert all(r["other"] < 0.25 * r["s_per_step"] for r in doc["rows"]), [(r["setting"], r["other"]) for r in doc["rows"]]
    assert doc["trl"] == {"skipped": "--no-trl"}
    assert [t["target"] for t in lease["targets"]] == [t[0] for t in load_script(os.path.join(ROOT, "benchmarks", "lease_results.py")).TARGETS]
    assert all(t["figure"] is None and t["met"] is None for t in lease["targets"])
    log = (out / row["log"]).read_text()
    assert "| model | setting | s_per_step |" in log and "dry run, colocated:" in log
    assert "[gpu_lease" in p.stdout and "row dry_run: done" in p.stdout and "target learner_mfu_lora: not measured" in p.stdout


def test_a_hanging_row_is_killed_at_the_deadline_and_the_rows_before_it_are_kept(tmp_path):
    """A row past its time is killed with its whole session (a child it started included), recorded
    as killed; a row with too little time left is not started; lease.json holds each after each row."""
    mod = _lease()
    child = tmp_path / "child.pid"
    hang = [sys.executable, "-c", "import subprocess, sys, time; p = subprocess.Popen([sys.executable, '-c', "
            "'import time; time.sleep(600)']); open(sys.argv[1], 'w').write(str(p.pid)); time.sleep(600)", str(child)]
    rows = [mod.Row("quick", cmd=[sys.executable, "-c", "print('ok')"]), mod.Row("hangs", cmd=hang, limit_s=600),
            mod.Row("late", cmd=[sys.executable, "-c", "print('never')"])]
    mod.PLANS["dry"], mod.RESERVE_S, mod.MIN_ROW_S = rows, 1.0, 2.0
    t0 = time.monotonic()
    rc = mod.main(["run", "--dry-run", "--out", str(tmp_path / "out"), "--budget-s", "9"])
    took = time.monotonic() - t0
    lease = json.loads((tmp_path / "out" / "lease.json").read_text())
    assert rc == 1 and took < 9, took
    quick, hangs, late = lease["rows"]
    assert quick["status"] == "done"
    assert hangs["status"].startswith("killed after ") and hangs["wall_s"] < hangs["limit_s"] + 2, hangs
    assert late["status"] == "not started" and "left before the deadline" in late["why"]
    try:  # the row's own child is gone too (or a zombie nobody reaps yet; a loaded machine takes a moment)
        proc = psutil.Process(int(child.read_text()))
        end = time.monotonic() + 10
        while proc.status() != psutil.STATUS_ZOMBIE and time.monotonic() < end:
            time.sleep(0.1)
        assert proc.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        pass


def test_pieces_are_joined_in_order(tmp_path):
    mod = _lease()
    data = os.urandom(3000)
    for i, k in enumerate(range(0, 3000, 1024)):
        (tmp_path / f"big-1.0-py3-none-any.whl.piece{i:02d}").write_bytes(data[k:k + 1024])
    (tmp_path / "small-1.0-py3-none-any.whl").write_bytes(b"x")
    assert mod.join_pieces(str(tmp_path)) == ["big-1.0-py3-none-any.whl"]
    assert (tmp_path / "big-1.0-py3-none-any.whl").read_bytes() == data
    assert sorted(os.listdir(tmp_path)) == ["big-1.0-py3-none-any.whl", "small-1.0-py3-none-any.whl"]


def test_each_target_is_read_from_its_row_and_set_beside_its_bound():
    mod = _lease()

    def rec(name, model, setting, **cols):
        return {"name": name, "status": "done", "table": {"rows": [dict(model=model, setting=setting, rc=0, **cols)]}}

    records = [rec("full_smollm2", "smollm2", "disagg", generate=1.0), rec("lora_smollm2", "smollm2", "lora", generate=1.5),
               rec("colocated_qwen2", "qwen2-0.5b", "colocated", sync=0.4),
               rec("lora_packed_qwen2", "qwen2-0.5b", "lora", mfu=0.12),
               {"name": "warm_start_qwen2", "status": "killed after 150 s"}]
    got = {t["target"]: (t["figure"], t["met"]) for t in mod.targets(records)}
    assert got == {"lora_generate_vs_full": (1.5, False), "colocated_sync_s": (0.4, True),
                   "learner_mfu_lora": (0.12, False), "warm_startup_s": (None, None), "vs_trl_steps_per_s": (None, None)}


def test_a_killed_rows_finished_steps_and_start_up_lines_are_kept(tmp_path):
    """A row killed after some steps has no table (gpu_e2e writes it at the end): the lease keeps the
    means of its steps after the first from its run's metrics.jsonl, a target reads them marked
    ``partial``, and the log's tail leaves out Ray's stack dumps (an H200 lease, 2026-11-27: every
    row's 6 KB tail was SIGTERM frames)."""
    mod = _lease()
    run = tmp_path / "runs" / "disagg_qwen2" / "qwen2-0.5b-disagg"
    run.mkdir(parents=True)
    steps = [{"timing/generate": 1.6, "timing/sync": 8.8}, {"timing/generate": 1.2, "timing/sync": 6.9},
             {"timing/generate": 1.0, "timing/sync": 5.9}]
    (run / "metrics.jsonl").write_text("".join(json.dumps(s) + "\n" for s in steps))
    (run / "workers.log").write_text("(EngineCore) init engine (profile, create kv cache, warmup model) took 31.2 s\n"
                                     "(EngineCore) Capturing CUDA graphs: 50%\nnothing to see\n")
    part = mod.partial_of(str(tmp_path / "runs" / "disagg_qwen2"))
    assert part["steps"] == 3 and part["means"] == {"generate": 1.1, "sync": 6.4}
    assert part["startup_lines"] == ["(EngineCore) init engine (profile, create kv cache, warmup model) took 31.2 s"]
    lora = {"name": "lora_packed_qwen2", "status": "done",
            "table": {"rows": [dict(model="qwen2-0.5b", setting="lora", rc=0, generate=1.0, mfu=0.02)]}}
    killed = {"name": "disagg_qwen2", "status": "killed after 170 s", **part}
    got = {t["target"]: t for t in mod.targets([lora, killed])}
    assert abs(got["lora_generate_vs_full"]["figure"] - 1.0 / 1.1) < 1e-9
    assert got["lora_generate_vs_full"]["partial"] == ["disagg_qwen2"] and got["learner_mfu_lora"]["partial"] == []
    one_step = {"name": "disagg_qwen2", "status": "killed", "steps": 1, "means": {"generate": 1.6}}
    assert {t["target"]: t["figure"] for t in mod.targets([lora, one_step])}["lora_generate_vs_full"] is None
    log = tmp_path / "row.log"
    log.write_text("actors ready in 111 s\n[2026 E 1 1] logging.cc:474: *** SIGTERM received ***\n"
                   "    @     0x7fa3  (unknown)  _start\n")
    assert mod.tail(str(log), 1000) == "actors ready in 111 s"
