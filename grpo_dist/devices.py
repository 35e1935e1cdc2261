"""Where each role runs: decided by the config's GPU counts (``cluster.learner_gpus``,
``cluster.rollout_gpus``), never by what the machine happens to have, and checked against the
machine before any actor starts.
"""

from __future__ import annotations

import os
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


def adapter_mode(cfg: Config) -> tuple[str, str]:
    """How rollout engines serve LoRA versions (``rollout.adapter_mode``) and why: ``lora``,
    ``merged`` or ``full`` (``lora.enabled: false``: every weight is trained and reloaded)."""
    if not cfg.lora.enabled:
        return "full", "lora.enabled is false"
    mode = cfg.rollout.adapter_mode
    if mode != "auto":
        return mode, "rollout.adapter_mode"
    if cfg.cluster.rollout_gpus > 0:
        return "lora", ("auto: engines on GPUs serve the adapter with vLLM's batched LoRA kernels (no weight "
                        "reload); set rollout.adapter_mode: merged to reload merged weights instead")
    return "merged", ("auto: CPU engines generate faster from merged weights than through vLLM's CPU LoRA "
                      "kernels; each version is merged into the base and reloaded in place; "
                      "set rollout.adapter_mode: lora to serve adapters")


def torch_threads(cfg: Config, role: str, peers_on_node: int = 1, node_cpus: Optional[int] = None) -> tuple[int, str]:
    """Threads for a ``role`` ("learner" or "rollout") actor with ``peers_on_node`` actors of its
    role on its node (``cluster.torch_threads``; auto as its description says); and why."""
    c = cfg.cluster
    if c.torch_threads != "auto":
        return int(c.torch_threads), "cluster.torch_threads"
    own = max(1, int(c.learner_cpus if role == "learner" else c.rollout_cpus))
    on_gpu = (c.learner_gpus if role == "learner" else c.rollout_gpus) > 0
    if on_gpu:
        return own, f"auto: on GPU, int(cluster.{role}_cpus)"
    if cfg.trainer.max_staleness != 0:
        return own, (f"auto: generation overlaps the update (trainer.max_staleness {cfg.trainer.max_staleness}), "
                     f"so int(cluster.{role}_cpus) to leave the engines their cores")
    if node_cpus is None:
        node_cpus = c.num_cpus if c.address is None and c.num_cpus else len(os.sched_getaffinity(0))
    n = max(1, node_cpus // max(1, peers_on_node))
    return n, (f"auto: trainer.max_staleness 0, the roles take turns: {node_cpus} CPUs on the node / "
               f"{peers_on_node} {role} rank(s) there")


BIND_ENV = "VLLM_CPU_OMP_THREADS_BIND"


def engine_cpus(cfg: Config, index_on_node: int, engines_on_node: int, learners_on_node: int,
                cpus: list[int]) -> tuple[Optional[str], str]:
    """The CPUs a vLLM CPU engine binds its OpenMP threads to (``VLLM_CPU_OMP_THREADS_BIND``), or
    None to leave vLLM's own choice; and why. vLLM's ``auto`` binds *every* engine of a node to the
    same cores (NUMA node 0 less a reserved CPU): two engines on 2 cores both ran on core 0 while
    core 1 idled. Here engine i of n on a node gets the i-th of n disjoint slices of ``cpus``;
    with generation overlapping the update (``trainer.max_staleness`` >= 1), the learner ranks on
    the node keep their threads' worth of cores first. An exported variable wins."""
    if cfg.rollout.backend != "vllm" or cfg.cluster.rollout_gpus > 0:
        return None, "not a vLLM CPU engine"
    if os.environ.get(BIND_ENV):
        return None, f"{BIND_ENV}={os.environ[BIND_ENV]} exported"
    free = sorted(cpus)
    if cfg.trainer.max_staleness != 0 and learners_on_node:
        keep = torch_threads(cfg, "learner", learners_on_node)[0] * learners_on_node
        if len(free) - keep >= engines_on_node:
            free = free[:len(free) - keep]
    per = len(free) // max(1, engines_on_node)
    mine = free[index_on_node * per:(index_on_node + 1) * per] if per else [free[index_on_node % len(free)]]
    return ",".join(map(str, mine)), (f"engine {index_on_node + 1} of {engines_on_node} on its node, "
                                      f"{len(free)} of the node's {len(cpus)} CPUs for engines")


def engine_dtype(cfg: Config) -> tuple[str, str]:
    """The dtype of the rollout engines' weights and why: ``rollout.dtype`` when set; float32 where
    the engines merge a LoRA adapter into bfloat16/float16 weights (8 or 11 significant bits: at a
    weight's usual size the adapter's delta is mostly under half their spacing, so the merged delta
    carries rounding noise about as large as itself; benchmarks/NOTES.md "bf16: where a LoRA update
    is lost"); else ``model.dtype``."""
    if cfg.rollout.dtype:
        return cfg.rollout.dtype, "rollout.dtype"
    if cfg.model.dtype in ("bfloat16", "float16") and adapter_mode(cfg)[0] == "merged":
        return "float32", (f"auto: the engines merge the adapter into their weights, and a {cfg.model.dtype} merge "
                           f"adds rounding noise about as large as the adapter's change (smaller than the weights' "
                           f"spacing); the learner keeps {cfg.model.dtype}; set rollout.dtype to choose")
    return cfg.model.dtype, "model.dtype"


def trainable_dtype(cfg: Config) -> str:
    """The dtype the learner trains in: float32 for a LoRA adapter with ``lora.dtype: float32`` (its
    weights, gradients and Adam state; the frozen base keeps ``model.dtype``), else ``model.dtype``.
    A float16 base keeps DeepSpeed's fp16 mode: its loss scaling is what keeps fp16 activations'
    gradients from underflowing, and the fp32 path has none."""
    if cfg.lora.enabled and cfg.lora.dtype == "float32" and cfg.model.dtype != "float16":
        return "float32"
    return cfg.model.dtype


def choices(cfg: Config) -> list[str]:
    """The defaults chosen for this machine and config, one line each, printed at start."""
    mode, why = adapter_mode(cfg)
    lines = [cfg.model._auto_dtype] if cfg.model._auto_dtype else []
    if mode != "full":
        lines.append(f"rollout.adapter_mode -> {mode}: {why}")
    dtype, why = engine_dtype(cfg)
    if why.startswith("auto"):
        lines.append(f"rollout.dtype -> {dtype}: {why}")
    if cfg.model.dtype == "bfloat16" and trainable_dtype(cfg) == "float32":
        lines.append("lora.dtype -> float32: the adapter's weights, gradients and Adam state in float32 on the "
                     "bfloat16 base (whose layers compute in bfloat16); lora.dtype: model for DeepSpeed's bf16 mode")
    if cfg.trainer._auto_staleness:
        lines.append(cfg.trainer._auto_staleness)
    return lines


def sleeps_while_learning(cfg: Config) -> bool:
    """Colocated on GPU: the engine frees its GPU memory (sleep level 1) while the learner trains."""
    return cfg.cluster.layout == "colocated" and cfg.cluster.rollout_gpus > 0 and cfg.rollout.backend == "vllm"
