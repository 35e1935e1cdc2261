"""An actor group as one adapter of several sees it (issue 53): the same actors, and every call
that acts on an adapter's state carries ``adapter=NAME``.

A run of several adapters starts one set of actors (``run/fleet.py``); each adapter's ``Run``
drives them through views, so the code of a single run -- the rollout manager, the weight sync,
checkpoints, evaluation -- drives its adapter unchanged. The calls named in ``methods`` get the
keyword; the rest (heartbeats, node info, replacement) go to the actors as they are. A view owns
nothing: its ``kill`` is a no-op (the fleet's group is killed once, by the fleet).
"""

from __future__ import annotations

from typing import Any, Sequence

# the actors' methods that act on one adapter (they take ``adapter=``)
LEARNER_METHODS = frozenset({"train_step", "compute_logprobs", "export_update", "publish_update", "save_adapter",
                             "save_checkpoint", "load_checkpoint", "checkpoint_files", "load_checkpoint_files",
                             "adapter_files", "refresh_reference", "weights_version"})
ROLLOUT_METHODS = frozenset({"generate", "load_update", "load_weights", "serve"})
REWARD_METHODS = frozenset({"score", "score_group", "names"})


class _Bound:
    """An actor method whose ``remote`` calls carry ``adapter=``."""

    def __init__(self, method: Any, adapter: str):
        self._method, self._adapter = method, adapter

    def remote(self, *args, **kwargs):
        return self._method.remote(*args, adapter=self._adapter, **kwargs)

    def options(self, **opts) -> "_Bound":
        return _Bound(self._method.options(**opts), self._adapter)


class AdapterActor:
    """An actor handle whose adapter methods carry ``adapter=NAME``."""

    def __init__(self, actor: Any, adapter: str, methods: frozenset[str]):
        self.actor, self.adapter, self._methods = actor, adapter, methods

    def __getattr__(self, name: str) -> Any:
        method = getattr(self.actor, name)
        return _Bound(method, self.adapter) if name in self._methods else method


class AdapterView:
    """``group`` (an ``ActorGroup``) as adapter ``adapter`` sees it."""

    def __init__(self, group: Any, adapter: str, methods: frozenset[str]):
        self.group, self.adapter, self._methods = group, adapter, methods
        self._handles: dict[int, AdapterActor] = {}

    def __getattr__(self, name: str) -> Any:  # get, role, timeout, replace, heartbeats: the group's own
        return getattr(self.group, name)

    @property
    def actors(self) -> list[AdapterActor]:
        """The group's actors now (replaced ones too), each wrapped once: the same actor is the same
        handle, so ``chunk.actor is view.actors[rank]`` tells a replaced engine from a live one."""
        return [self._handle(a) for a in self.group.actors]

    def _handle(self, actor: Any) -> AdapterActor:
        h = self._handles.get(id(actor))
        if h is None or h.actor is not actor:
            h = self._handles[id(actor)] = AdapterActor(actor, self.adapter, self._methods)
        return h

    def __len__(self) -> int:
        return len(self.group)

    def call(self, method: str, *args, **kwargs) -> list[Any]:
        return [getattr(a, method).remote(*args, **kwargs) for a in self.actors]

    def call_each(self, method: str, per_rank_args: Sequence[tuple]) -> list[Any]:
        return [getattr(a, method).remote(*args) for a, args in zip(self.actors, per_rank_args)]

    def kill(self) -> None:
        """Nothing: the fleet owns the actors."""
