"""DeepSpeed + PEFT learner: ``Learner`` (one data-parallel rank) and its helpers."""

from .batching import Collated, collate, micro_batch_rows
from .learner import Learner
from .optim import deepspeed_config, lr_factor

__all__ = ["Collated", "Learner", "collate", "deepspeed_config", "lr_factor", "micro_batch_rows"]
