"""The reward role's Ray actor class, in a module of its own. Ray sends an actor class by reference (its
module and name), so an actor's process imports the module that defines it: defined beside the learner's
and the engines' classes, a reward actor imported torch and their modules for nothing (~2 CPU-seconds
and ~300 MB per reward actor); from here it imports the reward worker only."""

from __future__ import annotations

from grpo_dist.cluster.actors import Placed
from grpo_dist.reward.worker import RewardWorker


class RewardActor(Placed, RewardWorker):
    pass
