"""How a run that ends early says so: one ``TrainingError`` naming the step, the cause and the
resume command (a mixin of :class:`grpo_dist.run.run.Run`; it reads the run's ``cfg``, ``step``,
``stop_requested``, ``save``, ``interrupted`` and ``_resume_point``)."""

from __future__ import annotations

import contextlib
from typing import Iterator

from grpo_dist.cluster.ray_utils import ClusterError
from grpo_dist.reward.failures import RewardFailureError
from grpo_dist.run.monitor import non_finite
from grpo_dist.run.outputs import resume_command, resume_hint
from grpo_dist.util.disk import WriteError


class TrainingError(RuntimeError):
    """The run stopped: the message says why, where it stopped and how to resume (exit 1)."""


class Stops:
    @contextlib.contextmanager
    def writes(self) -> Iterator[None]:
        """An output that could not be written (``disk.WriteError``: a full or read-only disk)
        becomes one TrainingError naming the file, the cause, the newest whole checkpoint and the
        resume command (every checkpoint is whole or absent: ``checkpoint.save``)."""
        try:
            yield
        except WriteError as e:
            raise TrainingError(f"{e}; stopped at step {self.step}: {resume_hint(self.cfg)}") from None

    @contextlib.contextmanager
    def stopping(self) -> Iterator[None]:
        """What ends a run early becomes one TrainingError naming the step and the resume command:
        a reward function failing too often (a checkpoint of the last finished step is saved
        first), an actor lost past recovery (a learner rank, restarts used up), an output that
        cannot be written (:meth:`writes`)."""
        with self.writes():  # (a save below may fail too)
            try:
                yield
            except RewardFailureError as e:
                if e.first_step and self.step == 0:  # broken from the first batch: nothing to keep
                    tail = f"\n{e.details()}" if e.traceback else ""
                    raise TrainingError(f"step 1: {e}; nothing was trained: fix {e.subject} and run again{tail}") from None
                path = self.save(self._resume_point)
                details = e.details()
                raise TrainingError(f"step {self.step + 1}: {e}; stopped with a checkpoint of step {self.step} in "
                                    f"{path}; fix {e.subject}, then resume with: {resume_command(self.cfg)}"
                                    f"{chr(10) + details if details else ''}") from None
            except ClusterError as e:
                if e.interrupted and self.stop_requested:  # Ctrl-C while an actor hangs: stop now, keep the last step
                    self.interrupted(settle=False, why=str(e))
                raise TrainingError(f"{e}; stopped at step {self.step}: {resume_hint(self.cfg)}") from e

    def check_finite(self, metrics: dict[str, float], where: str) -> None:
        bad = non_finite(metrics)
        if bad:
            raise TrainingError(f"step {self.step + 1}: non-finite metrics from {where}: {bad}; stopping: "
                                f"{resume_hint(self.cfg)}")

