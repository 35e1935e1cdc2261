"""Issue 52 item 2: a checkpoint survives a power cut, and one that did not (or lost a file since)
is never resumed from. Every file and directory of a checkpoint is fsynced before the rename that
names it, the parent after; ``manifest.json``, written last, names every other file and its size;
``resume: auto`` skips a checkpoint whose files do not match it (one line naming it and what is
wrong) and a named one is one ConfigError line. Checkpoints of earlier versions (no manifest) count
when their trainer_state.json parses.

Real checkpoints from a real in-process learner (as ``test_disk_faults.py``); os.fsync and
os.rename are recorded (and still done), nothing is faked. The end-to-end resume through
``grpo-dist train`` is
``test_resume_exact.py::test_a_damaged_newest_checkpoint_is_skipped_and_the_one_before_resumed``.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from grpo_dist.config import ConfigError
from grpo_dist.run import checkpoint
from grpo_dist.run.checkpoint import MANIFEST, STATE_FILE, check_resume, list_checkpoints, step_dir
from grpo_dist.run.outputs import resume_hint
from grpo_dist.util.disk import partial_dir
from grpo_dist.util.files import write_tree
from checkpoint_helpers import save_step, small_run_config
import checkpoint_helpers

learner = checkpoint_helpers.learner  # the module-scoped fixture


@pytest.fixture
def recorded(monkeypatch) -> list[tuple[str, ...]]:
    """Every ``os.fsync`` (the path its descriptor names) and ``os.rename``, in order."""
    events: list[tuple[str, ...]] = []
    fsync, rename = os.fsync, os.rename

    def on_fsync(fd):
        events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        fsync(fd)

    def on_rename(a, b):
        events.append(("rename", str(Path(a).resolve()), str(Path(b).resolve())))
        rename(a, b)

    monkeypatch.setattr(os, "fsync", on_fsync)
    monkeypatch.setattr(os, "rename", on_rename)
    return events


def test_write_tree_syncs_each_file_then_its_directories_deepest_first(tmp_path, recorded):
    root = (tmp_path / "t").resolve()
    write_tree(root, {"a/b/c.bin": b"x" * 10, "top.json": b"{}"})
    assert recorded == [("fsync", str(root / "a/b/c.bin")), ("fsync", str(root / "top.json")),
                        ("fsync", str(root / "a/b")), ("fsync", str(root / "a")), ("fsync", str(root))]
    recorded.clear()
    write_tree(tmp_path / "scratch", {"x": b"1"}, durable=False)  # a learner's scratch copy
    assert recorded == []


def test_a_checkpoint_reaches_the_disk_before_its_name_and_its_manifest_last(tmp_path, tiny_model_dir, learner,
                                                                               recorded):
    cfg = small_run_config(tiny_model_dir, tmp_path.resolve())
    out = save_step(cfg, learner, 1)
    tmp = partial_dir(out)
    at = recorded.index(("rename", str(tmp), str(out)))
    synced = [e[1] for e in recorded[:at] if e[0] == "fsync"]
    held = sorted(out.rglob("*"))
    assert len(held) > 5, held
    for p in held:  # every file and directory it holds, under its partial name
        assert str(tmp / p.relative_to(out)) in synced, p
    assert str(tmp) in synced
    files = [str(tmp / p.relative_to(out)) for p in held if p.is_file()]
    assert max(synced.index(f) for f in files if not f.endswith(MANIFEST)) < synced.index(str(tmp / MANIFEST))
    assert synced[-1] == str(tmp), "the directory after its last file (the manifest)"
    assert ("fsync", str(cfg.checkpoint_dir)) in recorded[at + 1:], "the new name synced after the rename"
    listed = json.loads((out / MANIFEST).read_text())["files"]
    assert listed == {p.relative_to(out).as_posix(): p.stat().st_size for p in held
                      if p.is_file() and p.name != MANIFEST}
    assert STATE_FILE in listed and any(k.startswith("adapter/") for k in listed)


def _damaged_copies(cfg, tmp_path: Path, learner) -> tuple[Path, Path]:
    """Whole checkpoints of steps 1 and 2 (written once per test, then copied)."""
    src = tmp_path / "src"
    if not src.is_dir():
        save_step(cfg, learner, 1)
        save_step(cfg, learner, 2)
        shutil.copytree(cfg.checkpoint_dir, src)
    return src, cfg.checkpoint_dir


def _learner_file(ckpt: Path) -> Path:
    """A file of the learner's DeepSpeed state (the issue's "file of its learner state removed")."""
    found = sorted(ckpt.glob("global_step*/*model_states.pt"))
    assert found, sorted(p.relative_to(ckpt).as_posix() for p in ckpt.rglob("*"))
    return found[0]


def test_resume_auto_skips_a_checkpoint_that_is_not_whole_naming_it_and_a_named_one_is_one_line(
        tmp_path, tiny_model_dir, learner, capsys):
    cfg = small_run_config(tiny_model_dir, tmp_path / "run")
    older, newest = step_dir(cfg, 1), step_dir(cfg, 2)

    def cut_state(d: Path) -> str:
        size = (d / STATE_FILE).stat().st_size
        (d / STATE_FILE).write_bytes(b"")  # what a power cut left before this change: a zero-length state
        return f"{STATE_FILE} has 0 bytes, its manifest says {size}"

    def remove_learner_file(d: Path) -> str:
        f = _learner_file(d)
        f.unlink()
        return f"{f.relative_to(d).as_posix()} is missing"

    def truncate_adapter(d: Path) -> str:
        f = d / "adapter" / "adapter_model.safetensors"
        size = f.stat().st_size
        os.truncate(f, size // 2)
        return f"adapter/adapter_model.safetensors has {size // 2} bytes, its manifest says {size}"

    def drop_manifest(d: Path) -> str:
        (d / MANIFEST).unlink()  # its state says it had one: not taken for an older version's checkpoint
        return f"no {MANIFEST}, which its {STATE_FILE} names"

    def garble_manifest(d: Path) -> str:
        (d / MANIFEST).write_bytes(b"")
        return f"{MANIFEST} unreadable (JSONDecodeError: Expecting value: line 1 column 1 (char 0))"

    for damage in (cut_state, remove_learner_file, truncate_adapter, drop_manifest, garble_manifest):
        src, dst = _damaged_copies(cfg, tmp_path, learner)
        shutil.rmtree(dst)
        shutil.copytree(src, dst)
        why = damage(newest)
        capsys.readouterr()
        cfg.checkpoint.resume = "auto"
        assert check_resume(cfg) == older, damage.__name__
        assert checkpoint.resolve(cfg) == older  # (the run resolves it again: said once)
        err = capsys.readouterr().err.splitlines()
        assert err == [f"warning: checkpoint.resume auto: skipping {newest}: not a complete checkpoint ({why})"], \
            damage.__name__
        assert list_checkpoints(cfg.checkpoint_dir) == [older]
        assert resume_hint(cfg).startswith(f"the last checkpoint is {older} (step 1)")
        cfg.checkpoint.resume = str(newest)  # named: one line, before anything starts
        with pytest.raises(ConfigError) as e:
            check_resume(cfg)
        assert str(e.value) == (f"checkpoint.resume: {newest} is not a complete checkpoint ({why}); name another, "
                                f"or resume with auto (the newest complete one)")
    learner.load_checkpoint(older)  # the one resumed from loads


def test_checkpoints_of_earlier_versions_count_when_their_state_parses(tmp_path, tiny_model_dir, learner, capsys):
    """Written before manifests: trainer_state.json written last, nothing fsynced. Its state parses:
    whole (the rest was complete when it was written); empty or cut: skipped."""
    cfg = small_run_config(tiny_model_dir, tmp_path / "run")
    save_step(cfg, learner, 1)
    save_step(cfg, learner, 2)
    for d in (step_dir(cfg, 1), step_dir(cfg, 2)):
        (d / MANIFEST).unlink()
        state = json.loads((d / STATE_FILE).read_text())
        del state["manifest"]
        (d / STATE_FILE).write_text(json.dumps(state))
    cfg.checkpoint.resume = "auto"
    assert list_checkpoints(cfg.checkpoint_dir) == [step_dir(cfg, 1), step_dir(cfg, 2)]
    assert check_resume(cfg) == step_dir(cfg, 2)
    text = (step_dir(cfg, 2) / STATE_FILE).read_text()
    (step_dir(cfg, 2) / STATE_FILE).write_text(text[: len(text) // 2])
    capsys.readouterr()
    assert check_resume(cfg) == step_dir(cfg, 1)
    assert capsys.readouterr().err.startswith(f"warning: checkpoint.resume auto: skipping {step_dir(cfg, 2)}: not a "
                                              f"complete checkpoint ({STATE_FILE} is not valid JSON (")
    (step_dir(cfg, 1) / STATE_FILE).write_bytes(b"")
    assert check_resume(cfg) is None
    out = capsys.readouterr()
    assert f"skipping {step_dir(cfg, 1)}: not a complete checkpoint ({STATE_FILE} is empty)" in out.err
    assert f"no complete checkpoint in {cfg.checkpoint_dir}, starting fresh (checkpoint.resume auto)" in out.out


def test_a_checkpoint_that_is_not_whole_is_replaced_or_pruned_never_counted(tmp_path, tiny_model_dir, learner):
    """``checkpoint.keep`` counts whole checkpoints only: a damaged newest one never pushes out the
    one a resume needs; the resumed run writes its step anew, and a damaged one older than a new
    checkpoint is removed."""
    cfg = small_run_config(tiny_model_dir, tmp_path / "run", keep=1)
    save_step(cfg, learner, 1)
    save_step(cfg, learner, 2)  # keep 1: step 1 pruned once step 2 is whole
    assert list_checkpoints(cfg.checkpoint_dir) == [step_dir(cfg, 2)]
    _learner_file(step_dir(cfg, 2)).unlink()
    cfg.checkpoint.keep = 2
    save_step(cfg, learner, 1)  # (a run that restarted from scratch: the damaged step 2 is newer, kept)
    assert list_checkpoints(cfg.checkpoint_dir) == [step_dir(cfg, 1)]
    assert step_dir(cfg, 2).is_dir()
    save_step(cfg, learner, 2)  # written anew over the damaged one
    assert list_checkpoints(cfg.checkpoint_dir) == [step_dir(cfg, 1), step_dir(cfg, 2)]
    (step_dir(cfg, 2) / STATE_FILE).write_bytes(b"")
    save_step(cfg, learner, 3)
    assert sorted(p.name for p in cfg.checkpoint_dir.iterdir()) == ["step_000001", "step_000003"]
