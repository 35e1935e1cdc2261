"""Weight sync: how versioned adapter tensors travel from the learner to every rollout worker.

``publish`` runs in the learner process (rank 0) and returns a small, picklable payload;
``receive`` runs in each rollout worker and turns the payload back into an ``AdapterUpdate``.
Whatever the transport, the worker then writes the update to its local disk cache
(``grpo_dist.sync.store.AdapterStore``).
"""

from __future__ import annotations

import abc
import os
import tempfile
from pathlib import Path

from grpo_dist.types import AdapterUpdate


class WeightTransport(abc.ABC):
    name: str = "base"

    @abc.abstractmethod
    def publish(self, update: AdapterUpdate) -> object:
        """Learner side: make ``update`` available; return the payload sent to workers."""

    @abc.abstractmethod
    def receive(self, payload: object) -> AdapterUpdate:
        """Worker side: the update the payload stands for."""


def default_tmp_root() -> Path:
    """/dev/shm where it is writable (tmpfs), else the system temporary directory."""
    shm = Path("/dev/shm")
    return shm if shm.is_dir() and os.access(shm, os.W_OK) else Path(tempfile.gettempdir())
