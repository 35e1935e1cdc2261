"""Default transport: the Ray object store.

The learner's returned ``AdapterUpdate`` already lives in the object store as the result of
``learner.publish_update.remote()``; the driver hands the same ``ObjectRef`` to every worker, so
the tensors are serialised once and each node fetches them once. Each worker then deserialises its
own copy (Ray pickles torch tensors: its zero-copy reads are for numpy arrays, or for torch only
with ``RAY_ENABLE_ZERO_COPY_TORCH_TENSORS``, which this project does not set) and writes it to its
``AdapterStore``.
"""

from __future__ import annotations

from grpo_dist.sync.base import WeightTransport
from grpo_dist.types import AdapterUpdate


class ObjectStoreTransport(WeightTransport):
    name = "object_store"

    def publish(self, update: AdapterUpdate) -> AdapterUpdate:
        return update

    def receive(self, payload: object) -> AdapterUpdate:
        if not isinstance(payload, AdapterUpdate):
            raise TypeError(f"object_store transport expected an AdapterUpdate, got {type(payload).__name__}")
        return payload
