"""Checkpoints: ``<checkpoint.dir>/step_<n>/`` holds the learner's DeepSpeed state (optimizer,
scheduler, step), the adapter in PEFT format (``adapter/``), each learner rank's torch RNG
(``learner_rng/rank<r>.pt``), and ``trainer_state.json`` (step, data position, the driver
process's Python ``random`` state). ``checkpoint.resume: auto`` continues from the newest one.

RNG: resuming restores the driver's Python ``random`` state and every learner rank's torch
generators (CPU, and the rank's GPU where it has one), which LoRA dropout draws from. The rollout
engines keep no RNG worth saving: each sample's seed is a function of (trainer.seed, step, prompt,
sample). So a resumed run repeats an uninterrupted one's steps exactly, dropout included
(``tests/test_resume_exact.py``).

Whole or absent: a checkpoint (and the final adapter) is written beside its final name
(``.partial-step_<n>``), every file and directory fsynced, and renamed when complete (the parent
fsynced after: a power cut never leaves a renamed directory of zero-length files); old ones are
renamed away before they are deleted (``util/disk.py``, ``util/files.py``). ``manifest.json``,
written last, names every other file and its size: a checkpoint is whole when what it holds
matches it and its ``trainer_state.json`` parses (:func:`problem`). ``resume: auto`` skips one that
is not, with one line naming it and what is wrong, and takes the newest whole one; a named one
that is not whole is a ConfigError. A checkpoint of an earlier version (no manifest) counts when
its ``trainer_state.json`` parses: that file was written last, so the rest was complete (though
not fsynced). A write that fails (a full or read-only disk) removes the partial one and raises
``disk.WriteError`` naming the checkpoint and the cause (``tests/test_disk_faults.py``)."""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import sys
from pathlib import Path
from typing import Any

from grpo_dist.config import Config, ConfigError
from grpo_dist.devices import trainable_dtype
from grpo_dist.util.disk import (WriteError, clear_leftovers, fsync_dir, partial_dir, remove_dir, replace_dir,
                                 writing)
from grpo_dist.util.files import read_tree, sync_tree, write_tree

STATE_FILE = "trainer_state.json"
MANIFEST = "manifest.json"  # {"files": {path: size}} of every other file, written last
_NAME = re.compile(r"step_(\d+)")


def step_dir(cfg: Config, step: int) -> Path:
    return cfg.checkpoint_dir / f"step_{step:06d}"


def _step(p: Path) -> int:
    return int(p.name.split("_")[1])


def _candidates(directory: Path) -> list[Path]:
    """Every ``step_<n>`` directory, whole or not, oldest first."""
    if not directory.is_dir():
        return []
    return sorted((p for p in directory.glob("step_*") if _NAME.fullmatch(p.name) and p.is_dir()), key=_step)


def list_checkpoints(directory: Path) -> list[Path]:
    """Whole checkpoints (:func:`problem` finds none, without reading their state), oldest first."""
    return [p for p in _candidates(directory) if problem(p, read_state=False) is None]


def _read_state(path: Path) -> tuple[dict, str | None]:
    """``trainer_state.json`` of the checkpoint at ``path``, or ``({}, what is wrong with it)``."""
    f = path / STATE_FILE
    try:
        text = f.read_bytes()
    except FileNotFoundError:
        return {}, f"no {STATE_FILE}"
    except OSError as e:
        return {}, f"{STATE_FILE} unreadable ({e.strerror or e})"
    if not text:
        return {}, f"{STATE_FILE} is empty"
    try:
        state = json.loads(text)
    except ValueError as e:
        return {}, f"{STATE_FILE} is not valid JSON ({e})"
    return (state, None) if isinstance(state, dict) else ({}, f"{STATE_FILE} holds no state")


def problem(path: Path, read_state: bool = True) -> str | None:
    """What makes the checkpoint at ``path`` not whole, in a few words (None when it is whole):
    a file its manifest names missing or of another size (files it does not name are not
    looked at), the manifest missing or unreadable, or (``read_state``) a trainer_state.json that
    does not parse. A checkpoint without a manifest whose state does not say it had one was written
    by an earlier version: whole when its trainer_state.json parses (the module doc)."""
    if not path.is_dir():
        return "no such directory"
    try:
        listed = json.loads((path / MANIFEST).read_bytes())["files"]
    except FileNotFoundError:
        state, why = _read_state(path)
        return why or (f"no {MANIFEST}, which its {STATE_FILE} names" if state.get("manifest") else None)
    except (OSError, ValueError, KeyError, TypeError) as e:
        return f"{MANIFEST} unreadable ({e.__class__.__name__}: {e})"
    if not isinstance(listed, dict):
        return f"{MANIFEST} unreadable (no file list)"
    for rel, size in sorted(listed.items()):
        try:
            have = (path / rel).stat().st_size
        except FileNotFoundError:
            return f"{rel} is missing"
        except OSError as e:
            return f"{rel} unreadable ({e.strerror or e})"
        if have != size:
            return f"{rel} has {have} bytes, its manifest says {size}"
    if STATE_FILE not in listed:
        return f"{MANIFEST} does not name {STATE_FILE}"
    return _read_state(path)[1] if read_state else None


def _manifest(root: Path) -> bytes:
    files = {p.relative_to(root).as_posix(): p.stat().st_size for p in sorted(root.rglob("*")) if p.is_file()}
    return json.dumps({"files": files}, indent=1).encode()


def _rng_state() -> dict[str, Any]:
    """The driver's random state: Python's ``random`` only. The driver draws nothing from torch
    (sampling seeds are derived from (trainer.seed, step, prompt), the prompt order from the
    stream's own seeded state), so there is no torch state to keep; each learner rank saves its
    own torch RNG next to its DeepSpeed state (``learner_rng/``)."""
    version, internal, gauss = random.getstate()
    return {"python": [version, list(internal), gauss]}


def _direct(cfg: Config) -> bool:
    """Learners write the checkpoint themselves (full weights on a shared filesystem)."""
    return not cfg.lora.enabled and cfg.cluster.shared_dir is not None


def save(cfg: Config, workers, step: int, data_state: dict, run_state: dict | None = None) -> Path:
    """``data_state``: the prompt stream's position to resume from (before any prompts already
    taken for rollouts that no step has trained on yet); ``run_state``: what the driver needs to
    continue its records (per-step metrics, the evaluation before training)."""
    out = step_dir(cfg, step)
    state = {"step": step, "data": data_state, "rng": _rng_state(), "run": run_state or {}, "holds": holds(cfg),
             "manifest": MANIFEST}  # (so a checkpoint that lost its manifest is not taken for an older version's)
    lg = workers.learner
    files: dict[str, bytes] = {}
    if not _direct(cfg):  # gathered before anything is written: the learners' part cannot fail midway here
        for rank_files in lg.get(lg.call("checkpoint_files", {"step": step})):
            for rel, data in rank_files.items():
                files.setdefault(rel, data)  # rank order: rank 0's copy of a shared file wins
    files[STATE_FILE] = json.dumps(state, indent=1).encode()
    clear_leftovers(cfg.checkpoint_dir)  # what a stopped run left half-written
    tmp = partial_dir(out)
    try:
        with writing(tmp):
            fresh = not cfg.checkpoint_dir.is_dir()
            tmp.mkdir(parents=True, exist_ok=True)
            if fresh:  # the checkpoint directory's own name
                fsync_dir(cfg.checkpoint_dir.parent)
        if _direct(cfg):
            lg.get(lg.call("save_checkpoint", str(tmp), {"step": step}))
        write_tree(tmp, files)  # each file, then each directory, fsynced
        if _direct(cfg):
            sync_tree(tmp)  # what the learners wrote
        write_tree(tmp, {MANIFEST: _manifest(tmp)})  # last: what a whole checkpoint holds
        replace_dir(tmp, out)  # renamed, then the parent fsynced
    except WriteError as e:
        raise _failed(e, "checkpoint", tmp, out) from e
    except BaseException:  # a learner failed writing it (shared_dir): nothing partial stays either
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    whole = list_checkpoints(cfg.checkpoint_dir)
    for old in whole[: -cfg.checkpoint.keep]:
        remove_dir(old)
    for old in _candidates(cfg.checkpoint_dir):  # one that is not whole and older than this: never resumed from
        if _step(old) < step and old not in whole:
            remove_dir(old)
    return out


def _failed(e: WriteError, what: str, tmp: Path, out: Path) -> WriteError:
    """The partial directory removed (absent rather than partial; it frees what it took), and the
    error naming the file as it would have been under its final name."""
    shutil.rmtree(tmp, ignore_errors=True)
    where = Path(e.path)
    shown = out / where.relative_to(tmp) if tmp in where.parents else out
    return WriteError(f"{what} {shown}", OSError(e.errno, e.strerror))


def save_final(cfg: Config, learner_group, out: Path) -> Path:
    """The trained adapter (or full model) as ``out`` on the driver's node. Every rank takes part
    (ZeRO-3 gathers; the save ends with a barrier)."""
    lg, out = learner_group, Path(out)
    files = None if _direct(cfg) else lg.get(lg.call("adapter_files"))[0]
    tmp = partial_dir(out)
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        if files is None:
            lg.get(lg.call("save_adapter", str(tmp)))
        else:
            write_tree(tmp, files, durable=False)  # (synced below, with the config set_base_model rewrites)
        with writing(tmp / "adapter_config.json"):
            set_base_model(tmp, cfg.model.path)
        sync_tree(tmp)  # every file and directory on the disk before the rename
        replace_dir(tmp, out)
    except WriteError as e:
        raise _failed(e, "adapter", tmp, out) from e
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def set_base_model(adapter_dir: Path, model_path: str) -> None:
    """The adapter's ``base_model_name_or_path``: the hub id, or the model directory as an absolute
    path (PeftModel.from_pretrained and vLLM find the base from any directory, not only from the
    one the run started in)."""
    from grpo_dist.hub import is_hub_id

    f = Path(adapter_dir) / "adapter_config.json"
    if not f.is_file():  # full weights: no adapter
        return
    base = model_path if is_hub_id(model_path) else os.path.abspath(os.path.expanduser(model_path))
    conf = json.loads(f.read_text())
    if conf.get("base_model_name_or_path") != base:
        conf["base_model_name_or_path"] = base
        f.write_text(json.dumps(conf, indent=2, sort_keys=True))


def load_into_learners(cfg: Config, learner_group, path: Path) -> None:
    """Every learner rank loads the checkpoint at ``path`` (a directory on the driver's node)."""
    lg = learner_group
    if _direct(cfg):
        lg.get(lg.call("load_checkpoint", str(path)))
        return
    import ray


    files = ray.put({rel: data for rel, data in read_tree(path).items() if rel not in (STATE_FILE, MANIFEST)})
    lg.get(lg.call("load_checkpoint_files", files))


_said: set[str] = set()


def _once(msg: str, log_fn) -> None:
    """Say ``msg`` once per process (the resume is checked before the run starts, then resolved again)."""
    if msg not in _said:
        _said.add(msg)
        log_fn(msg)


def resolve(cfg: Config) -> Path | None:
    """The checkpoint ``checkpoint.resume`` names: ``auto``: the newest whole one in
    ``checkpoint_dir`` (None when there is none), each newer one that is not whole skipped with one
    warning line naming it and what is wrong; a path: FileNotFoundError when it is not whole."""
    r = cfg.checkpoint.resume
    if not r:
        return None
    if r == "auto":
        for p in reversed(_candidates(cfg.checkpoint_dir)):
            why = problem(p)
            if why is None:
                return p
            _once(f"warning: checkpoint.resume auto: skipping {p}: not a complete checkpoint ({why})",
                  lambda m: print(m, file=sys.stderr, flush=True))
        return None
    p = Path(r)
    why = problem(p)
    if why is not None:
        raise FileNotFoundError(f"checkpoint.resume: {p} is not a complete checkpoint ({why}); name another, or "
                                f"resume with auto (the newest complete one)")
    return p


def _model_path(path: str) -> str:
    p = Path(path).expanduser()
    return str(p.resolve()) if p.exists() else path  # a hub id stays as it is


TRAINS_IN = "model.dtype / lora.dtype"  # recorded as the dtype they resolve to (devices.trainable_dtype)


def holds(cfg: Config) -> dict[str, Any]:
    """The config values a checkpoint's weights are made for: a resume must keep them."""
    out: dict[str, Any] = {"model.path": _model_path(cfg.model.path), "lora.enabled": cfg.lora.enabled}
    if cfg.lora.enabled:
        out.update({"lora.r": cfg.lora.r, "lora.alpha": cfg.lora.alpha,
                    "lora.target_modules": list(cfg.lora.target_modules)})
    # the dtype the weights train in (DeepSpeed's optimizer state differs between its 16-bit and fp32 paths)
    out[TRAINS_IN] = trainable_dtype(cfg)
    return out


def _held(path: Path) -> dict[str, Any]:
    """What the checkpoint at ``path`` holds: recorded in its state, else (older checkpoints)
    read from its adapter's ``adapter_config.json``."""
    state = json.loads((path / STATE_FILE).read_text())
    if "holds" in state:
        return state["holds"]
    adapter = path / "adapter" / "adapter_config.json"
    if not adapter.is_file():
        return {}
    a = json.loads(adapter.read_text())
    return {"lora.enabled": True, "lora.r": a.get("r"), "lora.alpha": a.get("lora_alpha"),
            "lora.target_modules": a.get("target_modules")}


def _show(v: Any) -> str:
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(str(x) for x in v) + "]"
    return str(v).lower() if isinstance(v, bool) else str(v)


def check_resume(cfg: Config, log_fn=print) -> Path | None:
    """The checkpoint a resume continues from, checked before anything starts: ConfigError
    (``checkpoint.resume: ...``) for a path that is no checkpoint, or a config that changes what
    the checkpoint holds (:func:`holds`: the model, full vs LoRA, LoRA rank, alpha and targets),
    naming every key that differs. ``resume: auto`` with no checkpoint logs that the run starts
    fresh."""
    if not cfg.checkpoint.resume:
        return None
    try:
        path = resolve(cfg)
    except FileNotFoundError as e:
        raise ConfigError(str(e)) from None
    if path is None:
        none = "no complete checkpoint" if _candidates(cfg.checkpoint_dir) else "no checkpoint"
        _once(f"{none} in {cfg.checkpoint_dir}, starting fresh (checkpoint.resume auto)", log_fn)
        return None
    old, new = _held(path), holds(cfg)
    same = lambda k: (sorted(old[k]) == sorted(new[k]) if k == "lora.target_modules" else old[k] == new[k])
    diff = [k for k in new if k in old and old[k] is not None and not same(k)]
    if not new["lora.enabled"] and old.get("lora.enabled"):
        diff = ["lora.enabled"]  # the LoRA keys do not apply to full weights
    if diff:
        what = ", ".join(f"{k} ({_show(old[k])}, now {_show(new.get(k))})" for k in diff)
        raise ConfigError(f"checkpoint.resume: {path} was trained with other {what}; resume with the checkpoint's "
                          f"values or start a new output_dir")
    return path


def restore(cfg: Config, workers, stream) -> tuple[int, dict, Path | None]:
    """Load the learner state and data position; returns (the step to continue from, the saved
    ``run_state``, the checkpoint path), ``(0, {}, None)`` when there is none."""
    path = resolve(cfg)
    if path is None:
        return 0, {}, None
    state = json.loads((path / STATE_FILE).read_text())  # (it parsed: resolve checked it)
    load_into_learners(cfg, workers.learner, path)
    stream.load_state_dict(state["data"])
    version, internal, gauss = state["rng"]["python"]
    random.setstate((version, tuple(internal), gauss))
    return int(state["step"]), dict(state.get("run", {})), path
