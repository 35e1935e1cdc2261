"""Where each role runs: decided by the config's GPU counts (``cluster.learner_gpus``,
``cluster.rollout_gpus``), never by what the machine happens to have, and checked against the
machine before any actor starts.
"""

from __future__ import annotations

from typing import Optional

from grpo_dist.config import Config, ConfigError


def check_devices(cfg: Config, device_count: Optional[int] = None) -> None:
    """A local run (``cluster.address`` null) that asks for more GPUs than this machine has:
    ``ConfigError`` with one line. With an address, the Ray cluster's GPUs are checked once
    connected (``check_resources``): the driver may run on a CPU-only head node."""
    need = cfg.resource_demand()["GPU"]
    if cfg.cluster.address is not None or need <= 0:
        return
    if device_count is None:
        import torch

        device_count = torch.cuda.device_count()
    if need > device_count + 1e-9:
        c = cfg.cluster
        asked = ", ".join(f"cluster.{k}={v:g}" for k, v in (("learner_gpus", c.learner_gpus),
                                                            ("rollout_gpus", c.rollout_gpus)) if v > 0)
        hint = "; set both to 0 for a CPU run" if device_count == 0 else ""
        raise ConfigError(f"cluster: {asked} need {need:g} GPUs but this machine has {device_count} "
                          f"CUDA device{'s' if device_count != 1 else ''}{hint}")


def learner_on_gpu(cfg: Config) -> bool:
    """The learner's device, for ``Learner.setup``: CUDA iff ``cluster.learner_gpus > 0``; a GPU
    asked for where this process sees none is a one-line ``RuntimeError``."""
    if cfg.cluster.learner_gpus <= 0:
        return False
    import torch

    if not torch.cuda.is_available():
        raise RuntimeError(f"cluster.learner_gpus={cfg.cluster.learner_gpus:g} but this learner process sees no "
                           "CUDA device (torch.cuda.is_available() is False)")
    return True
