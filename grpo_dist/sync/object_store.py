"""Default transport: the Ray object store, zero-copy.

The learner's ``publish_update`` returns an :class:`ArrayPayload`: its weights as numpy views of
its own tensors (``grpo_dist.sync.zero_copy.ArrayState``). Ray copies them into the object store
once as the call returns (out of band: no pickle of the bytes); the driver hands the same
``ObjectRef`` to every engine, each node fetches it once, and each engine reads read-only views of
the store's shared memory, which its layerwise reload copies into its weights in place (engines
with ``loads_in_memory``; others write a directory first). Torch tensors would be pickled and
unpickled into a private copy per reader (Ray's zero-copy tensors need
``RAY_ENABLE_ZERO_COPY_TORCH_TENSORS``, a process-wide switch this project does not set).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from grpo_dist.sync.base import WeightTransport
from grpo_dist.sync.zero_copy import ArrayState
from grpo_dist.types import AdapterUpdate


@dataclass
class ArrayPayload:
    version: int
    state: ArrayState
    peft_config: Optional[dict[str, Any]]


class ObjectStoreTransport(WeightTransport):
    name = "object_store"

    def publish(self, update: AdapterUpdate) -> ArrayPayload:
        return ArrayPayload(update.version, ArrayState.of(update.tensors), update.peft_config)

    def receive(self, payload: object) -> AdapterUpdate:
        if isinstance(payload, AdapterUpdate):  # an update handed over in this process
            return payload
        if not isinstance(payload, ArrayPayload):
            raise TypeError(f"object_store transport expected an ArrayPayload, got {type(payload).__name__}")
        return AdapterUpdate(payload.version, payload.state.tensors(), payload.peft_config)
