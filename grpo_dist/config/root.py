"""The root ``Config``: the sections together, the checks across sections and the defaults that
depend on the devices (never on this machine's: the driver may run on a CPU-only head node)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from pydantic import Field, model_validator

from grpo_dist.config.sections import (AlgoConfig, CheckpointConfig, ClusterConfig, DataConfig, EvalConfig,
                                       GPU_MEM_COLOCATED, GPU_MEM_DISAGGREGATED, LearnerConfig, LoggingConfig,
                                       LoraConfig, ModelConfig, RewardConfig, RolloutConfig, Section, SyncConfig,
                                       TrainerConfig, _KeyError)


class Config(Section):
    output_dir: str = Field("runs/default", description="Where summary.json, checkpoints, adapters and W&B files go.")
    model: ModelConfig = Field(default_factory=ModelConfig)
    lora: LoraConfig = Field(default_factory=LoraConfig)
    data: DataConfig = Field(default_factory=DataConfig)
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    reward: RewardConfig = Field(default_factory=RewardConfig)
    algo: AlgoConfig = Field(default_factory=AlgoConfig)
    learner: LearnerConfig = Field(default_factory=LearnerConfig)
    sync: SyncConfig = Field(default_factory=SyncConfig)
    cluster: ClusterConfig = Field(default_factory=ClusterConfig)
    logging: LoggingConfig = Field(default_factory=LoggingConfig)
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig)
    trainer: TrainerConfig = Field(default_factory=TrainerConfig)
    eval: EvalConfig = Field(default_factory=EvalConfig)
    adapters: list[dict[str, Any]] = Field(
        default_factory=list, description="Several LoRA adapters trained at once on the shared base, engines and "
        "learner: a list of {name: NAME, <section>: {<key>: value}} changing what an adapter may own (data, eval, "
        "reward, algo, the learner's optimizer and schedule, lora r/alpha/dropout, trainer seed/steps/max_minutes, "
        "rollout group_size/prompts_per_step/max_tokens/temperature); outputs under output_dir/adapters/NAME. "
        "Empty: one adapter, the run's own config. `--sweep KEY=V1,V2` fills it (docs/adapters.md).")

    @model_validator(mode="after")
    def _cross(self) -> "Config":
        self._device_defaults()
        n = self.rollout.prompts_per_step * self.rollout.group_size
        per_rank = self.learner.num_learners * self.learner.micro_batch_size
        if n % self.learner.num_learners:
            raise _KeyError("learner.num_learners",
                             f"batch {n} (prompts_per_step * group_size) is not divisible by {self.learner.num_learners} ranks")
        per_rank_n = n // self.learner.num_learners
        if self.learner.micro_batch_tokens is None and per_rank_n > self.learner.micro_batch_size and \
                per_rank_n % self.learner.micro_batch_size:
            raise _KeyError("learner.micro_batch_size",
                             f"per-rank batch {n // self.learner.num_learners} is not divisible by micro_batch_size "
                             f"{self.learner.micro_batch_size} (need prompts_per_step*group_size % {per_rank} == 0)")
        if self.rollout.max_tokens >= self.model.max_model_len:
            raise _KeyError("rollout.max_tokens", f"{self.rollout.max_tokens} leaves no room for the prompt "
                             f"within model.max_model_len {self.model.max_model_len}")
        room = self.model.max_model_len - self.rollout.max_tokens
        if self.data.max_prompt_tokens is not None and self.data.max_prompt_tokens > room:
            raise _KeyError("data.max_prompt_tokens", f"{self.data.max_prompt_tokens} exceeds model.max_model_len - "
                             f"rollout.max_tokens = {room}")
        a = self.algo
        if a.ref_refresh_every and not (a.beta > 0 and a.kl_reference == "ref"):
            raise _KeyError("algo.ref_refresh_every", "refreshes the KL reference, but there is none "
                             f"(algo.beta={a.beta:g}, algo.kl_reference={a.kl_reference}); set beta > 0 and kl_reference: ref")
        t, n_iter = self.trainer, self.algo.num_iterations
        if t.max_staleness == "auto":
            k, why = (n_iter, "trainer.async_rollouts is true") if t.async_rollouts else auto_staleness(self)
            t.max_staleness = k
            t._auto_staleness = f"trainer.max_staleness auto -> {k}: {why}"
        if t.async_rollouts and t.max_staleness == 0:  # the alias: one step ahead
            t.max_staleness = n_iter
        if t.max_staleness % n_iter:
            raise _KeyError("trainer.max_staleness", f"{t.max_staleness} is not a multiple of algo.num_iterations "
                             f"{n_iter} (each step adds {n_iter} adapter versions; the pipeline runs whole steps ahead)")
        if t.max_staleness and not t.async_rollouts:  # the learner reads it: pi_old = behaviour log-probs
            t.async_rollouts = True
        if t.max_staleness and (self.rollout.top_p < 1.0 or self.rollout.top_k > 0):
            raise _KeyError("trainer.max_staleness", "(or trainer.async_rollouts) needs the engine's log-probs of "
                             "the full distribution for the importance ratio; top_p < 1 / top_k > 0 renormalise "
                             "them (use top_p 1, top_k -1)")
        c = self.cluster
        if self.sync.transport == "filesystem" and not c.shared_dir:
            raise _KeyError("sync.transport", "filesystem needs cluster.shared_dir (a directory every node "
                             "mounts at the same path); or use object_store")
        if self.sync.transport == "collective":
            self._check_collective()
        if self.rollout.inflight_updates and self.lora.enabled and (
                self.rollout.adapter_mode == "lora" or (self.rollout.adapter_mode == "auto" and c.rollout_gpus > 0)):
            raise _KeyError("rollout.inflight_updates", "needs merged or full weights (rollout.adapter_mode: merged): "
                             "a request keeps the LoRA adapter it started with, and LoRA loads never wait anyway")
        if c.shared_dir and not self.lora.enabled and not _inside(self.output_dir, c.shared_dir):
            raise _KeyError("output_dir", f"full-weight training with cluster.shared_dir writes checkpoints from "
                             f"the learner nodes: output_dir must be inside {c.shared_dir}")
        if c.layout == "colocated" and c.rollout_gpus > 0 and self.trainer.max_staleness:
            raise _KeyError("trainer.max_staleness", "(or trainer.async_rollouts): colocated on GPU, the engines "
                             "sleep while the learner trains: nothing can generate during the update (use layout: "
                             "disaggregated, or max_staleness 0)")
        if c.layout == "colocated" and self.rollout.num_workers != self.learner.num_learners:
            raise _KeyError("cluster.layout", f"colocated puts rollout engine i with learner rank i: "
                             f"rollout.num_workers ({self.rollout.num_workers}) must equal learner.num_learners "
                             f"({self.learner.num_learners})")
        if not self.reward.functions:
            raise _KeyError("reward.functions", "at least one reward function is needed")
        if a.rollout_is != "none" and (self.rollout.top_p < 1.0 or self.rollout.top_k > 0):
            raise _KeyError("algo.rollout_is", "needs the engine's log-probs of the full distribution; top_p < 1 / "
                             "top_k > 0 renormalise them (use top_p 1, top_k -1)")
        if max(self.eval.pass_k) > self.eval.samples_per_prompt:
            raise _KeyError("eval.pass_k", f"k={max(self.eval.pass_k)} exceeds eval.samples_per_prompt "
                             f"{self.eval.samples_per_prompt}")
        if self.cluster.address is None and self.cluster.num_cpus is not None:
            # the local cluster is one node with num_cpus CPUs (GPUs: grpo_dist.devices checks them)
            # and no custom resources: the same per-node check the placement does on a real cluster
            from grpo_dist.config.placement import PlacementError, check_feasible, plan

            node = {"CPU": float(self.cluster.num_cpus), "GPU": self.resource_demand()["GPU"]}
            try:
                check_feasible(plan(self), {"local" + "0" * 27: node})
            except PlacementError as e:
                raise _KeyError("cluster.num_cpus", f"the local cluster ({self.cluster.num_cpus} CPUs, no custom "
                                 f"resources) cannot hold the actors: {str(e).removeprefix('cluster: ')}") from None
        return self

    def _check_collective(self) -> None:
        """What ``sync.transport: collective`` can carry (``grpo_dist/sync/collective.py``)."""
        c, r = self.cluster, self.rollout
        if r.backend != "vllm":
            raise _KeyError("sync.transport", "collective loads weights into vLLM engines in place: it needs "
                             "rollout.backend: vllm")
        if self.lora.enabled and (r.adapter_mode == "lora" or (r.adapter_mode == "auto" and c.rollout_gpus > 0)):
            raise _KeyError("sync.transport", "collective carries LoRA adapters only to engines that merge them "
                             "(rollout.adapter_mode: merged, the CPU default); engines serving adapters with LoRA "
                             "kernels load them from files: use object_store")
        if self.lora.enabled and c.rollout_gpus > 0:
            raise _KeyError("sync.transport", "collective with LoRA merges in CPU engines (gloo); on GPUs use "
                             "object_store for adapters (a few MB)")
        if self.sync.collective_backend == "nccl" and (self.lora.enabled or not (c.rollout_gpus > 0 and c.learner_gpus > 0)):
            raise _KeyError("sync.collective_backend", "nccl (vLLM's NCCL weight transfer) carries full weights between "
                             "a learner and engines on GPUs (lora.enabled false, cluster.learner_gpus and "
                             "cluster.rollout_gpus > 0); use auto or gloo")
        if c.rollout_gpus > 0 and c.layout == "colocated":
            raise _KeyError("sync.transport", "collective over NCCL needs a GPU per party (NCCL refuses two ranks "
                             "on one device): use cluster.layout: disaggregated, or object_store when colocated")

    def _device_defaults(self) -> None:
        """Fill the device-dependent fields left null from the config's GPU counts (never from
        what this machine has: the driver may run on a CPU-only head node), and ``model.dtype:
        auto`` (on a CPU-only config, the resolving machine's CPU says whether bf16 is native)."""
        c, gpu_roll = self.cluster, self.cluster.rollout_gpus > 0
        if self.model.dtype in (None, "auto"):
            self.model.dtype, why = auto_dtype(gpu_roll or c.learner_gpus > 0)
            self.model._auto_dtype = f"model.dtype auto -> {self.model.dtype}: {why}"
        if self.rollout.enforce_eager is None:
            self.rollout.enforce_eager = not gpu_roll
        if self.rollout.streaming and self.rollout.engine_in_process:
            raise _KeyError("rollout.engine_in_process", "true needs the batch pipeline: vLLM's async engine "
                            "(rollout.streaming) runs its core in a process of its own; leave it null")
        if self.rollout.engine_in_process is None:
            self.rollout.engine_in_process = not gpu_roll and not self.rollout.streaming
        if self.rollout.gpu_memory_utilization is None:
            colocated = getattr(c, "layout", "disaggregated") == "colocated"
            self.rollout.gpu_memory_utilization = (0.3 if not gpu_roll else GPU_MEM_COLOCATED if colocated
                                                   else round(GPU_MEM_DISAGGREGATED * min(1.0, c.rollout_gpus), 4))

    def resource_demand(self) -> dict[str, float]:
        c = self
        return {
            "CPU": c.rollout.num_workers * c.cluster.rollout_cpus + c.reward.num_workers * c.cluster.reward_cpus
            + c.learner.num_learners * c.cluster.learner_cpus,
            "GPU": c.rollout.num_workers * c.cluster.rollout_gpus + c.learner.num_learners * c.cluster.learner_gpus,
        }

    @property
    def checkpoint_dir(self) -> Path:
        return Path(self.checkpoint.dir) if self.checkpoint.dir else Path(self.output_dir) / "checkpoints"


def _inside(path: str, parent: str) -> bool:
    """``path``, resolved as the run will (against the submitter's directory in a Ray job), lies in
    ``parent``; true when it cannot be resolved here (the run's resolution names that problem)."""
    from grpo_dist.util.paths import user_path

    p, q = user_path(path), user_path(parent)
    if p is None or q is None:
        return True
    p, q = Path(os.path.normpath(p)), Path(os.path.normpath(q))
    return p == q or q in p.parents


def auto_dtype(gpus: bool) -> tuple[str, str]:
    """``model.dtype: auto``: bfloat16 on GPUs (by the config's GPU counts: the driver may run on a
    CPU-only head node) and on a CPU that computes it natively (AVX512_BF16, AMX, Arm BF16; read on
    the resolving machine), else float32."""
    if gpus:
        return "bfloat16", "the config gives the learner or the engines GPUs"
    from grpo_dist.util.cpu import bf16_native

    native, why = bf16_native()
    if native:
        return "bfloat16", (f"a CPU-only config, and this CPU ({why}) computes bfloat16 natively; engines that "
                            f"merge the adapter keep float32 weights (rollout.dtype), the adapter trains in float32 "
                            f"(lora.dtype)")
    return "float32", f"a CPU-only config, and this CPU ({why}) computes bfloat16 slower than float32"


def auto_staleness(cfg: "Config") -> tuple[int, str]:
    """``trainer.max_staleness: auto``: one step ahead (``algo.num_iterations`` versions) only where
    generation and the update can really overlap, i.e. engines and learner on GPUs of their own."""
    c, r = cfg.cluster, cfg.rollout
    if r.top_p < 1.0 or r.top_k > 0:
        return 0, "top_p < 1 / top_k > 0: the engine's log-probs cannot stand for pi_old"
    if c.rollout_gpus > 0 and c.learner_gpus > 0 and c.layout == "disaggregated":
        return cfg.algo.num_iterations, ("engines and learner have GPUs of their own: the next batch is generated "
                                         "while the learner trains (set trainer.max_staleness: 0 for on-policy)")
    if c.rollout_gpus > 0 and c.layout == "colocated":
        return 0, "colocated on GPU: the engines sleep while the learner trains"
    return 0, ("the engines and the learner share CPU cores: generating during the update slows both; "
               "set trainer.max_staleness: 1 to overlap them anyway "
               "(latency-bound tiny models gain)")
