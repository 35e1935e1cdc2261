"""Weight transports behind one small base class (``WeightTransport``)."""

from pathlib import Path

from grpo_dist.sync.base import WeightTransport
from grpo_dist.sync.store import AdapterStore
from grpo_dist.sync.filesystem import FilesystemTransport
from grpo_dist.sync.object_store import ObjectStoreTransport


def make_transport(cfg) -> WeightTransport:
    """``cfg``: the whole config. The filesystem transport writes under
    ``<cluster.shared_dir>/<trainer.run_id>/sync`` (a directory every node sees, one per run)."""
    s = cfg.sync
    if s.transport in ("object_store", "collective"):  # collective: the group carries the training
        # versions (sync/collective.py); a payload still travels the object store (load_update)
        return ObjectStoreTransport()
    if s.transport == "filesystem":
        if not cfg.cluster.shared_dir or not cfg.trainer.run_id:
            raise ValueError("sync.transport: filesystem needs cluster.shared_dir and trainer.run_id")
        return FilesystemTransport(Path(cfg.cluster.shared_dir) / cfg.trainer.run_id / "sync", keep=s.keep_versions)
    raise ValueError(f"sync.transport: unknown transport {s.transport!r}")


__all__ = ["AdapterStore", "WeightTransport", "ObjectStoreTransport", "FilesystemTransport", "make_transport"]
