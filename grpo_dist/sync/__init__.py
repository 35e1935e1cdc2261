"""Weight sync: transports behind one small base class (``WeightTransport``), the driver's
``WeightSync`` and the factories that pick them (``factory.py``)."""

from grpo_dist.sync.base import WeightTransport
from grpo_dist.sync.factory import make_transport
from grpo_dist.sync.filesystem import FilesystemTransport
from grpo_dist.sync.object_store import ObjectStoreTransport
from grpo_dist.sync.store import AdapterStore

__all__ = ["AdapterStore", "WeightTransport", "ObjectStoreTransport", "FilesystemTransport", "make_transport"]
