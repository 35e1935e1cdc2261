"""The two factories of weight sync: the engine-side transport that carries a version's payload
(``make_transport``) and the driver's ``WeightSync`` that issues both halves of a push
(``make_weight_sync``), both chosen by ``sync.transport``."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from grpo_dist.sync.base import WeightTransport
from grpo_dist.sync.filesystem import FilesystemTransport
from grpo_dist.sync.object_store import ObjectStoreTransport

if TYPE_CHECKING:  # Ray is imported only by the driver's sync, when it is made
    from grpo_dist.sync.weight_sync import WeightSync


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


def make_weight_sync(cfg) -> "WeightSync":
    """The driver's sync for ``sync.transport``: a payload transport's, or the process group's."""
    from grpo_dist.sync.weight_sync import WeightSync

    if cfg.sync.transport == "collective":
        from grpo_dist.sync.collective import CollectiveSync

        return CollectiveSync(cfg)
    return WeightSync(allow_newer=cfg.rollout.streaming)
