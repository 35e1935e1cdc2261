"""The disk fills mid-run, through the real driver (``grpo_dist.train.train``) on the tiny config
with its output_dir on a small disk of its own (``small_disk``: a tmpfs), W&B offline and a
checkpoint each step. A run callback fills the disk at the end of step 3, before that step's
metrics line and checkpoint are written. The run stops with one TrainingError line naming the
file and the cause (the CLI prints it as ``error: ...`` and exits 1), nothing reaches the console
as a traceback (closing the run and the worker-log router on the full disk included), every
checkpoint is whole, and once the disk is freed ``checkpoint.resume: auto`` continues from step
2's checkpoint and finishes.

The writers' faults one by one (midway through a checkpoint, a read-only disk, W&B's files, the
worker logs) are ``test_disk_faults.py``.
"""

from __future__ import annotations

import re
import time

import e2e
import pytest

from grpo_dist.run.checkpoint import STATE_FILE
from grpo_dist.run.outputs import read_metrics
from grpo_dist.run.run import TrainingError

pytestmark = pytest.mark.slow
STEPS = 3
LINE = re.compile(r"disk full writing (?:checkpoint |adapter )?(/\S+) \(No space left on device\); stopped at step "
                  r"(\d+): the last checkpoint is (\S+) \(step (\d+)\); resume with: grpo-dist train --config (\S+) "
                  r"--checkpoint.resume auto")


class FillsTheDisk:
    """At the end of step ``at``, before its metrics line and checkpoint: the disk is full."""

    def __init__(self, small_disk, at: int):
        self.small_disk, self.at, self.filler = small_disk, at, None

    def on_step(self, run, step, metrics, groups, batch) -> None:
        if step == self.at:
            self.filler = self.small_disk.fill(run.out.parent)


@pytest.mark.timeout(300)
def test_disk_full_mid_run_one_line_whole_checkpoints_resume_finishes(tiny_model_dir, small_disk, ray_cluster,
                                                                       capfd):
    out = small_disk("8m") / "run"
    sections = dict(steps=STEPS, checkpoint={"every": 1, "keep": STEPS}, logging={"wandb_mode": "offline"})
    t0 = time.time()
    fill = FillsTheDisk(small_disk, at=3)
    run = e2e.start(e2e.config(tiny_model_dir, out, **sections), fill)
    from grpo_dist.cluster.worker_logs import unroute
    from grpo_dist.train import train

    try:
        with pytest.raises(TrainingError) as e:
            train(run)
    finally:
        run.close()  # W&B's close and the actors' on the full disk
    unroute()  # the worker-log router's close (the CLI's shutdown): the observed second traceback
    stopped_s = time.time() - t0
    msg = str(e.value)
    assert "\n" not in msg and e.value.__cause__ is None and e.value.__suppress_context__, msg  # `error: <msg>`
    m = LINE.fullmatch(msg)
    assert m, msg
    path, last, k = m.group(1), m.group(3), int(m.group(4))
    assert int(m.group(2)) == 3 and k == 2, msg
    assert path.startswith(f"{out}/") and last == str(out / "checkpoints" / "step_000002"), msg
    assert m.group(5) == str(out / "config.yaml")
    console = capfd.readouterr()
    assert "Traceback" not in console.err + console.out, console.err[-3000:]
    # every checkpoint whole, none partial or half-deleted; metrics.jsonl whole lines of steps 1-2 (or 1-3)
    ckpts = sorted(p.name for p in (out / "checkpoints").iterdir())
    assert ckpts == ["step_000001", "step_000002"], ckpts
    assert all((out / "checkpoints" / c / STATE_FILE).is_file() for c in ckpts)
    assert [h["step"] for h in read_metrics(out)] in ([1.0, 2.0], [1.0, 2.0, 3.0])

    fill.filler.unlink()  # the user frees the disk and resumes
    t1 = time.time()
    sections["checkpoint"]["resume"] = "auto"
    resumed, summary = e2e.train_run(e2e.config(tiny_model_dir, out, **sections))
    assert f"resumed from step 2 ({last})" in capfd.readouterr().out
    assert summary["steps"] == STEPS and resumed.step == STEPS
    assert [h["step"] for h in read_metrics(out)] == [float(s) for s in range(1, STEPS + 1)]
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == [f"step_{s:06d}" for s in range(1, STEPS + 1)]
    print(f"\nto the full disk and stopped {stopped_s:.0f} s, resumed and finished {time.time() - t1:.0f} s\n{msg}")
