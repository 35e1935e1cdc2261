"""A training from its config, end to end, as ``grpo-dist train`` and ``GRPOTrainer.train()`` both run
it: one code path (``cli.cmd_train`` and ``api.GRPOTrainer`` only build the config and read the outcome).

:func:`train_config`:

1. pre-flight (:func:`check`), before Ray starts: the inputs resolved, the ``output_dir`` checked
   (a file? writable? a live run's lock?) and a resume against its checkpoint, then the files the
   run's inputs need written there (the Python API's in-memory datasets), the GPUs the config asks
   for, every input of each adapter's config (``run/preflight.py``). A problem is one
   ``ConfigError`` line naming the key;
2. the run (:func:`run`): one ``Run``, or a ``Fleet`` of adapters (``adapters:`` / ``--sweep``),
   holding ``<output_dir>/run.lock``; SIGINT / SIGTERM (Ctrl-C, also in a notebook) let the current
   step finish, save a checkpoint and stop (``Interrupted``), a second one stops at once
   (``Interrupted`` too, naming the last checkpoint); W&B, checkpoints and ``summary.json`` are the
   run's; Ray is shut down after, when this call started it.

What the run printed ends with its summary (``summary_lines``; the adapters' table). The outcome is
the summary (``summary.json``; of several adapters the comparison) or an exception, which
:func:`exit_code` maps to the CLI's exit code.
"""

from __future__ import annotations

import contextlib
import sys
import threading
from pathlib import Path
from typing import Any

from grpo_dist.config import Config, adapter_configs


def train_config(cfg: Config, callbacks: tuple = (), files: dict[Path, bytes] | None = None) -> dict[str, Any]:
    """Pre-flight, then the run (see the module's docstring); ``files``: absolute path -> contents,
    written into the checked ``output_dir`` before the pre-flight reads them."""
    cfg, adapters = check(cfg, files)
    return run(cfg, adapters, callbacks)


def check(cfg: Config, files: dict[Path, bytes] | None = None) -> tuple[Config, dict[str, Config]]:
    """Every input checked before any actor starts; ``(cfg with its inputs resolved, each
    adapter's config)``. ConfigError (one line) on the first problem."""
    from grpo_dist.run.inputs import resolve_inputs

    cfg = resolve_inputs(cfg)  # a relative model/data path: like output_dir (the submitter's dir in a Ray job)
    from grpo_dist.run.lock import check_dir, probe
    from grpo_dist.run.outputs import resolve_outputs

    resolved = resolve_outputs(cfg, write=False)  # the output_dir, a resume against its checkpoint: nothing written
    probe(resolved.output_dir)
    if resolved.checkpoint.dir:
        check_dir(resolved.checkpoint.dir, "checkpoint.dir")
    if files:
        from grpo_dist.util.disk import write_atomic

        for path, data in files.items():  # inside an output_dir no live run holds
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            write_atomic(path, data)
    from grpo_dist.util.procenv import setup_env

    setup_env()
    from grpo_dist.devices import check_devices

    check_devices(cfg)  # the GPUs the config asks for exist (local cluster)
    from grpo_dist.run import preflight

    adapters = adapter_configs(cfg)
    for one in adapters.values() or [cfg]:  # model, reward plug-ins, data: each adapter's
        preflight.check(one)
    return cfg, adapters


def run(cfg: Config, adapters: dict[str, Config], callbacks: tuple = ()) -> dict[str, Any]:
    """Train a checked config under its output-dir lock and the signal handlers (see the module's
    docstring); the summary."""
    from grpo_dist.cluster.ray_utils import shutdown_ray
    from grpo_dist.run.lock import OutputLock
    from grpo_dist.run.outputs import adapters_table, resume_hint, summary_lines
    from grpo_dist.run.run import Interrupted, Run, TrainingError

    started_ray = not _ray_up()  # a notebook's own Ray session stays up after
    if adapters:
        from grpo_dist.run.fleet import Fleet

        target = Fleet(cfg, adapters, callbacks)  # absolute output_dir (relative in a Ray job: refused), run id
    else:
        target = Run(cfg, callbacks=callbacks)
    lock = OutputLock(target.cfg.output_dir).acquire()  # one run per output_dir
    try:
        with stop_on_signals(target):
            if adapters:
                from grpo_dist.train import train_adapters

                summaries, failed = train_adapters(target.runs)
                summary = target.write_summary(summaries, failed)
            else:
                from grpo_dist.train import train

                summary = train(target)
    except KeyboardInterrupt:  # the second signal: no checkpoint of the unfinished step
        raise Interrupted(f"stopped at once at step {target.step}: {resume_hint(target.cfg)}") from None
    finally:
        try:
            target.close()
            if started_ray:
                shutdown_ray()
        finally:
            lock.release()  # (a SIGKILLed run leaves it: the next run takes it over with a warning)
    if not adapters:
        print("\n".join(summary_lines(summary)), flush=True)
        return summary
    print("\n".join(adapters_table(summary)), flush=True)
    if target.stop_requested:
        raise Interrupted(f"interrupted ({target.stop_requested}): each adapter saved its last finished step "
                          f"(the lines above)")
    if failed:
        raise TrainingError(f"adapter(s) {', '.join(failed)} stopped before the end (their lines above; the others "
                            f"finished)")
    return summary


def _ray_up() -> bool:
    ray = sys.modules.get("ray")
    return ray is not None and ray.is_initialized()


@contextlib.contextmanager
def stop_on_signals(run):
    """SIGINT / SIGTERM: the first lets the current step finish, saves a checkpoint and stops
    (``Interrupted``); a second one stops at once (KeyboardInterrupt). The handlers are restored
    after; none outside the main thread (Python allows them only there)."""
    import signal

    def handler(signum, _frame):
        if run.stop_requested:
            raise KeyboardInterrupt
        name = signal.Signals(signum).name
        run.request_stop(name)
        print(f"{name}: stopping after step {run.step + 1} finishes and is saved (again to stop at once)",
              file=sys.stderr, flush=True)

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def exit_code(e: BaseException) -> int | None:
    """The CLI's exit code for what :func:`train_config` raised: 2 a config problem (nothing
    started), 1 a run that failed (it names the step and the resume command), 130 interrupted;
    None for anything else (a bug: its traceback)."""
    from grpo_dist.config import ConfigError

    if isinstance(e, ConfigError):
        return 2
    from grpo_dist.cluster.ray_utils import ClusterError
    from grpo_dist.run.run import Interrupted, TrainingError
    from grpo_dist.util.disk import WriteError

    if isinstance(e, Interrupted):
        return 130
    if isinstance(e, (ClusterError, TrainingError, WriteError)):
        return 1
    return None
