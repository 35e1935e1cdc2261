"""A full disk, a read-only output directory and a write that fails midway: each output is whole
or absent afterwards, and the failure is one ``WriteError`` naming the path and the cause.

On real small filesystems (``small_disk``: a size-limited tmpfs; skipped only where it cannot be
mounted), with the real writers: the checkpoint writer fed by a real in-process learner, the
metrics and summary writers, W&B offline, the worker-log router. The end-to-end run through the
CLI is ``test_disk_e2e.py``.
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path

import pytest

from grpo_dist.run import checkpoint
from grpo_dist.run.outputs import read_metrics, write_metrics, write_summary
from grpo_dist.util.disk import PARTIAL, WriteError, remove_dir, replace_dir, write_atomic
from checkpoint_helpers import Here, save_step, small_run_config
import checkpoint_helpers

learner = checkpoint_helpers.learner  # the module-scoped fixture

FULL = "No space left on device"
READ_ONLY = "Read-only file system"


# ----------------------------------------------------------------------------- metrics, summary


def test_metrics_line_cut_midway_by_a_full_disk_leaves_whole_lines(small_disk):
    out = small_disk("64k")
    lines = [{"step": float(i), "x": 0.5} for i in range(1, 4)]
    write_metrics(out, lines, append=False)
    pad = 4096 - (out / "metrics.jsonl").stat().st_size % 4096 - 10  # the file ends 10 bytes short of a page
    write_metrics(out, [{"step": 4.0, "pad": "p" * (pad - len('{"step": 4.0, "pad": ""}\n'))}])
    before = (out / "metrics.jsonl").read_bytes()
    assert len(before) % 4096 == 4086
    filler = small_disk.fill(out)
    with pytest.raises(WriteError) as e:  # its first 10 bytes fit in the last page, the rest does not
        write_metrics(out, [{"step": 5.0, "y": "z" * 200}])
    assert str(e.value) == f"disk full writing {out / 'metrics.jsonl'} ({FULL})"
    assert (out / "metrics.jsonl").read_bytes() == before  # nothing of the half-written line stays
    assert [h["step"] for h in read_metrics(out)] == [1.0, 2.0, 3.0, 4.0]
    filler.unlink()
    write_metrics(out, [{"step": 5.0}])
    assert [h["step"] for h in read_metrics(out)] == [1.0, 2.0, 3.0, 4.0, 5.0]


def test_read_only_output_dir_names_the_file_and_keeps_it(small_disk):
    out = small_disk("1m")
    write_metrics(out, [{"step": 1.0}], append=False)
    small_disk.read_only(out)
    for write in (lambda: write_metrics(out, [{"step": 2.0}]), lambda: write_metrics(out, [{"step": 2.0}], append=False)):
        with pytest.raises(WriteError) as e:
            write()
        assert str(e.value) == f"cannot write {out / 'metrics.jsonl'} ({READ_ONLY})"
    with pytest.raises(WriteError, match=f"cannot write {out / 'summary.json'} \\({READ_ONLY}\\)"):
        write_summary(out, 1, 1.0, out / "adapter", None, {}, [], None, None)
    assert read_metrics(out) == [{"step": 1.0}]


def test_a_file_rewritten_on_a_full_disk_keeps_its_old_content(small_disk):
    out = small_disk("64k")
    write_atomic(out / "summary.json", json.dumps({"steps": 1}))
    small_disk.fill(out)
    with pytest.raises(WriteError, match=f"disk full writing {out / 'summary.json'} \\({FULL}\\)"):
        write_atomic(out / "summary.json", json.dumps({"steps": 2, "pad": "x" * 8192}))
    assert json.loads((out / "summary.json").read_text()) == {"steps": 1}
    assert sorted(p.name for p in out.iterdir() if not p.name.startswith(".filler")) == ["summary.json"]


# ----------------------------------------------------------------------------- checkpoints, adapter


def _whole(cfg) -> list[int]:
    """The steps of the checkpoints a resume may take."""
    return [int(p.name.split("_")[1]) for p in checkpoint.list_checkpoints(cfg.checkpoint_dir)]


def test_checkpoint_cut_midway_by_a_full_disk_is_absent_and_resume_takes_the_one_before(
        small_disk, tiny_model_dir, learner):
    out = small_disk("2m")
    cfg = small_run_config(tiny_model_dir, out)
    save_step(cfg, learner, 1)
    size = sum(f.stat().st_size for f in checkpoint.step_dir(cfg, 1).rglob("*") if f.is_file())
    filler = small_disk.fill(out, leave=size // 2)  # room for about half of the next one
    with pytest.raises(WriteError) as e:
        save_step(cfg, learner, 2)
    msg = str(e.value)
    assert msg.startswith(f"disk full writing checkpoint {checkpoint.step_dir(cfg, 2)}/") and msg.endswith(f"({FULL})")
    assert Path(msg.split()[3]).name != checkpoint.STATE_FILE, msg  # it failed midway, before the last file
    names = sorted(p.name for p in cfg.checkpoint_dir.iterdir())
    assert names == ["step_000001"], names  # step 2 absent, nothing partial left (its space freed)
    cfg.checkpoint.resume = "auto"
    resumed = checkpoint.resolve(cfg)
    assert resumed == checkpoint.step_dir(cfg, 1)
    learner.load_checkpoint(resumed)  # whole: DeepSpeed (its `latest` tag), the adapter and the RNG load
    filler.unlink()
    save_step(cfg, learner, 2)
    assert _whole(cfg) == [1, 2]


def test_checkpoint_on_a_read_only_disk_names_it_and_keeps_the_others(small_disk, tiny_model_dir, learner):
    out = small_disk("4m")
    cfg = small_run_config(tiny_model_dir, out, keep=1)
    save_step(cfg, learner, 1)
    small_disk.read_only(out)
    with pytest.raises(WriteError) as e:
        save_step(cfg, learner, 2)
    assert str(e.value) == f"cannot write checkpoint {checkpoint.step_dir(cfg, 2)} ({READ_ONLY})"
    assert _whole(cfg) == [1]  # and keep=1 pruned nothing: the only whole one stays
    remove_dir(checkpoint.step_dir(cfg, 1))  # a deletion that cannot even start leaves it whole
    assert _whole(cfg) == [1]
    small_disk.writable(out)
    save_step(cfg, learner, 2)
    assert _whole(cfg) == [2]  # pruned once the new one is whole
    assert sorted(p.name for p in cfg.checkpoint_dir.iterdir()) == ["step_000002"]


def test_leftovers_of_a_killed_writer_are_never_resumed_from(tmp_path, tiny_model_dir, learner):
    cfg = small_run_config(tiny_model_dir, tmp_path)
    save_step(cfg, learner, 1)
    d = cfg.checkpoint_dir
    (d / f"{PARTIAL}step_000002").mkdir()  # a writer killed midway (this code)
    (d / f"{PARTIAL}step_000002" / checkpoint.STATE_FILE).write_text("{}")
    (d / "step_000003").mkdir()  # one of older code, killed before its last file
    (d / "step_000003.tmp").mkdir()  # a name that is no checkpoint's
    (d / "step_000003.tmp" / checkpoint.STATE_FILE).write_text("{}")
    assert _whole(cfg) == [1]
    save_step(cfg, learner, 4)
    assert _whole(cfg) == [1, 4]
    assert not list(d.glob(f"{PARTIAL}*")), "the partial one is cleared by the next save"


def test_final_adapter_on_a_full_disk_keeps_the_old_one_whole(small_disk, tiny_model_dir, learner):
    out = small_disk("1m")
    cfg = small_run_config(tiny_model_dir, out)
    adapter = checkpoint.save_final(cfg, Here(learner), out / "adapter")
    old = {p.name: p.read_bytes() for p in adapter.iterdir()}
    small_disk.fill(out, leave=64 * 1024)  # less than the adapter's weights
    with pytest.raises(WriteError) as e:
        checkpoint.save_final(cfg, Here(learner), out / "adapter")
    assert str(e.value) == f"disk full writing adapter {adapter / 'adapter_model.safetensors'} ({FULL})"
    assert {p.name: p.read_bytes() for p in adapter.iterdir()} == old
    assert sorted(p.name for p in out.iterdir() if not p.name.startswith(".filler")) == ["adapter"]


def test_a_directory_swapped_in_keeps_the_old_one_when_the_swap_fails(tmp_path):
    (tmp_path / "adapter").mkdir()
    (tmp_path / "adapter" / "w").write_text("old")
    with pytest.raises(WriteError, match=f"cannot write {tmp_path / 'adapter'} "):
        replace_dir(tmp_path / ".partial-adapter", tmp_path / "adapter")  # (it does not exist: the rename fails)
    assert (tmp_path / "adapter" / "w").read_text() == "old"
    (tmp_path / ".partial-adapter").mkdir()
    (tmp_path / ".partial-adapter" / "w").write_text("new")
    replace_dir(tmp_path / ".partial-adapter", tmp_path / "adapter")
    assert [p.name for p in tmp_path.iterdir()] == ["adapter"] and (tmp_path / "adapter" / "w").read_text() == "new"


def test_write_error_crosses_a_process_boundary():
    import pickle

    e = pickle.loads(pickle.dumps(WriteError("/x/metrics.jsonl", OSError(28, FULL))))
    assert str(e) == f"disk full writing /x/metrics.jsonl ({FULL})" and e.full


# ----------------------------------------------------------------------------- W&B, worker logs


def test_wandb_records_lost_on_a_full_disk_are_reported(small_disk):
    from grpo_dist.run.monitor.wandb_logger import WandbMonitor

    out = small_disk("16m")
    wb = WandbMonitor(mode="offline", project="disk", entity=None, name=None, directory=out, config={},
                      run_id=f"disk{os.getpid()}")
    try:
        wb.log({"train/loss": 1.0}, 1)
        wb.check()  # nothing failed yet
        small_disk.fill(out)
        deadline, err = time.time() + 30, None
        step = 2
        while err is None and time.time() < deadline:  # W&B writes in a process of its own, a moment later
            wb.log({"train/loss": 1.0, "pad": "x" * 5000}, step)
            step += 1
            try:
                wb.check()
            except WriteError as e:
                err = e
            time.sleep(0.2)
        assert err is not None, "W&B lost records on a full disk and nothing said so"
        assert str(err).startswith(f"disk full writing {out}/wandb/") and str(err).endswith(f".wandb ({FULL})"), err
    finally:
        wb.close()


def test_pyproject_pins_wandb_to_the_release_whose_wording_the_test_above_checks():
    """``WandbMonitor.check`` reads wandb-core's own log line, which a release may reword: the
    test above runs the installed wandb, so pyproject admits that minor release only."""
    import tomllib
    from importlib.metadata import version

    from packaging.requirements import Requirement
    from packaging.version import Version

    deps = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())["project"]["dependencies"]
    spec = next(r.specifier for r in map(Requirement, deps) if r.name == "wandb")
    v = Version(version("wandb"))
    assert v in spec, f"the installed wandb {v} (tested) is outside pyproject's wandb{spec}"
    before, after = Version(f"{v.major}.{v.minor - 1}.99") if v.minor else None, Version(f"{v.major}.{v.minor + 1}.0")
    untested = [str(x) for x in (before, after) if x is not None and x in spec]
    assert not untested, f"pyproject's wandb{spec} admits untested releases {untested} (tested: {v})"


def test_worker_log_router_never_raises_on_a_full_disk(small_disk):
    from grpo_dist.cluster.worker_logs import WorkerLogs, _QuietHandler

    out = small_disk("64k")
    logs = WorkerLogs(out / "workers.log")
    handler = _QuietHandler(logs)
    small_disk.fill(out)
    line = {"pid": 1, "actor_name": "Learner", "lines": ["x" * 3000] * 10}
    for _ in range(5):
        logs(line)  # Ray's dispatcher thread: dropped, not raised
    handler.emit(logging.LogRecord("py.warnings", logging.WARNING, __file__, 1, "w" * 9000, None, None))
    logs.close()
    assert logs.failed is not None and logs.failed.strerror == FULL
    with pytest.raises(WriteError, match=f"cannot write {out / 'w2.log'} \\({READ_ONLY}\\)"):
        small_disk.read_only(out)
        WorkerLogs(out / "w2.log")


def test_run_lock_on_a_full_disk_is_one_error(small_disk):
    from grpo_dist.run.lock import OutputLock

    out = small_disk("64k")
    small_disk.fill(out)
    with pytest.raises(WriteError, match=f"^disk full writing {out / 'run.lock'} \\({FULL}\\)$"):
        OutputLock(str(out)).acquire()  # the CLI prints it as `error: ...` and exits 1 before anything starts
