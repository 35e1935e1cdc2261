"""Weight transports behind one small base class (``WeightTransport``)."""

from grpo_dist.sync.base import WeightTransport
from grpo_dist.sync.store import AdapterStore
from grpo_dist.sync.filesystem import FilesystemTransport
from grpo_dist.sync.object_store import ObjectStoreTransport


def make_transport(cfg) -> WeightTransport:
    """``cfg`` is the ``sync`` config section."""
    if cfg.transport == "object_store":
        return ObjectStoreTransport()
    if cfg.transport == "filesystem":
        return FilesystemTransport(cfg.tmp_dir, keep=cfg.keep_versions)
    raise ValueError(f"sync.transport: unknown transport {cfg.transport!r}")


__all__ = ["AdapterStore", "WeightTransport", "ObjectStoreTransport", "FilesystemTransport", "make_transport"]
