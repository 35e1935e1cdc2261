"""Many LoRA adapters on one base model in one learner rank (issue 53).

Each adapter is a whole :class:`PolicyModel` of its own -- its PEFT wrapper, its DeepSpeed engine
with its optimizer state, learning-rate schedule, step count and gradient clipping, its KL
reference -- over a module *structure* of its own whose base weights are the same tensors as every
other adapter's. The base is loaded once; an adapter adds its LoRA factors, their optimizer state
and a few Python objects. No gradient crosses adapters: an adapter's engine knows only its own
factors, and the base weights are frozen.

Why structures that share weights rather than PEFT's several adapters in one model: one DeepSpeed
engine has one optimizer, one schedule and one clipping norm over all it holds, and under ZeRO-1/2
an adapter that takes no part in a step would still see Adam move its moments with zero gradients;
separate engines give each adapter exactly the update it would get alone (tested bit for bit).
ZeRO-3 partitions the base inside its engine, so a base shared by several engines cannot be
partitioned: several adapters need ``learner.zero_stage`` <= 2 (refused in the config otherwise).
"""

from __future__ import annotations

import copy
import time
from typing import Optional

import torch

from grpo_dist.config import Config
from grpo_dist.config.adapters import check_shared

from .model import PolicyModel, join_group, load_base

def shared_structure(model: torch.nn.Module) -> torch.nn.Module:
    """A copy of ``model``'s modules whose parameters and buffers are ``model``'s own tensors
    (nothing of the weights is copied): PEFT can wrap it in an adapter of its own."""
    memo = {id(t): t for t in list(model.parameters()) + list(model.buffers())}
    return copy.deepcopy(model, memo)


def build_adapters(cfgs: dict[str, Config], rank: int, world_size: int, master_addr: str, master_port: int,
                   local_rank: Optional[int]) -> dict[str, PolicyModel]:
    """One :class:`PolicyModel` per adapter, in ``cfgs``' order, over one base loaded once."""
    check_shared(cfgs)
    first = next(iter(cfgs.values()))
    device, t_dist = join_group(first, rank, world_size, master_addr, master_port, local_rank)
    t0 = time.perf_counter()
    base, pad = load_base(first)
    template = shared_structure(base) if len(cfgs) > 1 else None  # taken before PEFT wraps ``base`` in place
    out: dict[str, PolicyModel] = {}
    for i, (name, cfg) in enumerate(cfgs.items()):
        t1 = time.perf_counter()
        model = base if i == 0 else shared_structure(template)
        out[name] = PolicyModel.wrap(cfg, model, device, pad, rank, world_size)
        out[name].timing = {"timing/init_distributed": t_dist if i == 0 else 0.0,
                            "timing/model": time.perf_counter() - (t0 if i == 0 else t1)}
    return out


def base_bytes(policies: dict[str, PolicyModel]) -> int:
    """Bytes of the frozen weights the adapters hold, each tensor once (the base: held once however
    many adapters there are)."""
    seen: dict[int, int] = {}
    for p in policies.values():
        for t in p.module.parameters():
            if not t.requires_grad:
                seen[t.data_ptr()] = t.numel() * t.element_size()
    return sum(seen.values())
