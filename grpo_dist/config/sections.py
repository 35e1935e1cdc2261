"""The config sections: one pydantic model per top-level key, each field with its default and help.
(The rollout section is in ``rollout_section.py``; the base classes in ``base.py``.)"""

from __future__ import annotations

import math
import re
from typing import Any, Literal, Optional, Union

from pydantic import Field, PrivateAttr, field_validator, model_validator

from grpo_dist.config.base import ConfigError, Section, _int_or_auto, _KeyError  # noqa: F401 - re-exported
from grpo_dist.config.presets import PRESETS, apply_preset
from grpo_dist.config.rollout_section import GPU_MEM_COLOCATED, GPU_MEM_DISAGGREGATED, RolloutConfig  # noqa: F401
from grpo_dist.util.callables import CallableSpec, spec_of


class TinyModelSpec(Section):
    size: Literal["tiny", "small"] = Field("tiny", description="Architecture size of the generated model.")
    pretrain_task: Optional[str] = Field("add", description="Synthetic task to pretrain on (noisy labels).")
    steps: Optional[int] = Field(None, description="Pretraining steps (None = the task's default).")
    seed: int = Field(0, description="Seed for weights, data and noise.")


class ModelConfig(Section):
    path: str = Field("models/tiny-add", description="Model loaded by vLLM and the learner: a local HF model directory, "
                      "or a hub id (Qwen/Qwen2.5-0.5B-Instruct) fetched into the HF cache unless HF_HUB_OFFLINE=1, or "
                      "pkg:<name> (pkg:smollm2-135m-instruct) / a .gguf file, converted once into the project cache.")
    make_if_missing: Optional[TinyModelSpec] = Field(
        None, description="If set and model.path does not exist, generate a local tiny model there first.")
    dtype: Optional[Literal["auto", "float32", "bfloat16", "float16"]] = Field(
        "auto", description="Weights dtype for learner and vLLM. auto (or null): bfloat16 when cluster.learner_gpus "
        "or rollout_gpus > 0, or on a CPU that computes bfloat16 natively (AVX512_BF16, AMX, Arm BF16; read on the "
        "machine that resolves the config: the driver's), else float32. The start block says what it chose.")
    max_model_len: int = Field(256, gt=0, description="Max prompt + completion tokens.")
    _auto_dtype: Optional[str] = PrivateAttr(None)  # why dtype auto chose what it chose
    trust_remote_code: bool = Field(False, description="Passed to transformers and vLLM.")


class LoraConfig(Section):
    enabled: bool = Field(True, description="Train a LoRA adapter (else all weights, synced via vLLM reload_weights).")
    r: int = Field(8, gt=0, description="LoRA rank.")
    alpha: float = Field(16.0, gt=0, description="LoRA alpha (scaling = alpha / r).")
    dropout: float = Field(0.0, ge=0.0, lt=1.0, description="LoRA dropout.")
    target_modules: list[str] = Field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
        description="Module names that get LoRA.")
    dtype: Literal["float32", "model"] = Field(
        "float32", description="The adapter's weights, gradients and optimizer state in the learner: float32 (a "
        "bfloat16 base still computes its own layers in bfloat16; PEFT's default) or model (the model's dtype: "
        "DeepSpeed's bf16 mode, fp32 master copies, gradients accumulated in bf16). A float16 base always "
        "trains in DeepSpeed's fp16 mode (its loss scaling).")


class DataConfig(Section):
    path: str = Field("builtin:add", description="Prompts: builtin:<task>[?n=&max_operand=], .jsonl, .json, .parquet, a saved HF dataset dir or hf:<hub name>[:<config>] (docs: data.md).")
    split: Optional[str] = Field(None, description="Split of a saved HF DatasetDict or hub dataset (default train).")
    eval_path: Optional[str] = Field("auto", description="Held-out prompts: auto = the data's test split, else "
                                     "data.eval_size prompts held out of training; or a source (same formats); null = no eval.")
    eval_split: Optional[str] = Field(None, description="Split of the eval dataset.")
    eval_size: int = Field(64, gt=0, description="Number of held-out prompts used by evaluation (eval_path auto "
                           "without a test split: held out of the training prompts, at most half of them).")
    prompt_column: str = Field("prompt", description="Column holding the prompt text.")
    answer_column: str = Field("answer", description="Column holding the reference answer.")
    column_mapping: dict[str, str] = Field(default_factory=dict, description="Rename source columns {source: target}.")
    chat_template: bool = Field(False, description="Wrap prompts with the tokenizer's chat template.")
    system_prompt: Optional[str] = Field(None, description="System message when chat_template is on.")
    limit: Optional[int] = Field(None, gt=0, description="Use at most this many training prompts.")
    shuffle: bool = Field(True, description="Reshuffle prompts every epoch (seeded by trainer.seed).")
    max_prompt_tokens: Optional[int] = Field(None, gt=0, description="Longest prompt in tokens (default "
                                             "model.max_model_len - rollout.max_tokens); checked before any actor starts.")
    overlong_prompts: Literal["drop", "error"] = Field("error", description="Prompts longer than "
                                                       "max_prompt_tokens: stop with one line (error) or drop them (counted and logged).")


# vLLM memory fractions when rollout.gpu_memory_utilization is null and the engines are on GPUs:
# an engine alone on its GPU takes vLLM's own default; sharing with the learner (colocated), half.
class RewardFnConfig(Section):
    name: Optional[str] = Field(None, description="Name used in logs (reward/<name>); defaults to fn.")
    fn: str = Field(..., description="Builtin name (correctness, math, format, length, pattern, composite), 'module:function' or "
                    "'file.py:function'; from Python (GRPOTrainer, docs/python-api.md) also the function itself, a closure, "
                    "a lambda or an object with __call__ (sent to the reward actors by value; config.yaml records its name).")
    weight: float = Field(1.0, description="Weight in the total reward.")
    kwargs: dict[str, Any] = Field(default_factory=dict, description="Keyword arguments bound to the function.")

    @field_validator("fn", mode="wrap")
    @classmethod
    def _callable(cls, v: Any, handler: Any) -> str:
        """A callable from Python: its ``module:qualname``, or itself as a ``CallableSpec`` (a str)."""
        if isinstance(v, CallableSpec):
            return v
        return spec_of(v) if callable(v) and not isinstance(v, str) else handler(v)

    @field_validator("weight")
    @classmethod
    def _finite(cls, v: float) -> float:
        if not math.isfinite(v):
            raise ValueError("must be finite")
        return v


class RewardConfig(Section):
    functions: list[RewardFnConfig] = Field(
        default_factory=lambda: [RewardFnConfig(fn="correctness")], description="Reward functions, summed with weights.")
    num_workers: int = Field(1, gt=0, description="Number of reward actors.")
    timeout_s: float = Field(30.0, gt=0, description="Per-call timeout of one reward function on one batch.")
    failure_reward: float = Field(0.0, description="Reward given where a function raised, timed out or returned NaN.")
    max_failure_rate: float = Field(0.5, ge=0, le=1, description="Stop the run (checkpoint first) when one function "
                                    "failed on more than this fraction of its completions over the last failure_window steps (1 = never).")
    failure_window: int = Field(5, gt=0, description="Steps over which reward.max_failure_rate is measured (the check "
                                "starts once this many steps ran).")


KL_KINDS = Literal["k1", "k2", "k3", "low_var_kl"]
AGG_MODES = Literal["seq-mean-token-mean", "token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"]


class AlgoConfig(Section):
    preset: str = Field("grpo", description=f"One of {sorted(PRESETS)}; fills the fields below you leave unset.")
    loss: Literal["clip", "weighted_nll"] = Field("clip", description="Clipped surrogate (PPO/GRPO) or the softmax-weighted variant's weighted NLL.")
    adv_estimator: Literal["group", "rloo", "softmax"] = Field("group", description="Group z-score, leave-one-out, or in-group softmax weights.")
    adv_scale: Literal["group", "batch", "none"] = Field("group", description="Divide advantages by the group std, batch std, or nothing.")
    std_unbiased: bool = Field(True, description="Unbiased (n-1) std for advantage scaling.")
    adv_eps: float = Field(1e-4, ge=0, description="Added to the std before dividing.")
    softmax_temperature: float = Field(1.0, gt=0, description="Temperature of the in-group softmax (adv_estimator softmax).")
    beta: float = Field(0.04, ge=0, description="KL coefficient (0 = no KL, no reference pass).")
    kl_kind: KL_KINDS = Field("k3", description="KL estimator.")
    kl_reference: Literal["ref", "old"] = Field("ref", description="KL against the frozen reference or the old policy (the seed_notebook preset's naive KL).")
    clip_low: float = Field(0.2, gt=0, lt=1, description="Lower clip: ratio >= 1 - clip_low.")
    clip_high: float = Field(0.2, gt=0, description="Upper clip: ratio <= 1 + clip_high.")
    dual_clip: Optional[float] = Field(None, gt=1, description="Dual-clip constant c > 1 for negative advantages.")
    ratio_level: Literal["token", "sequence"] = Field("token", description="Token ratio (PPO/GRPO) or sequence ratio (GSPO).")
    agg: AGG_MODES = Field("seq-mean-token-mean", description="How per-token losses become one scalar.")
    max_len: Optional[int] = Field(None, gt=0, description="Normaliser of seq-mean-token-sum-norm (default "
                                   "rollout.max_tokens; multi-turn: rollout.max_total_tokens, else max_turns * max_tokens).")
    num_iterations: int = Field(1, gt=0, description="Gradient updates per batch (old log-probs recomputed when > 1).")
    dynamic_sampling: bool = Field(False, description="Drop zero-spread groups and refill with new prompts (DAPO).")
    max_sampling_rounds: int = Field(3, ge=0, description="Extra generation rounds dynamic sampling may spend per step.")
    overlong_buffer: float = Field(0.0, ge=0, lt=1, description="Soft length penalty starts this fraction before max_tokens "
                                   "(0 = off); multi-turn: every completion token (environment ones too) against "
                                   "rollout.max_total_tokens, as that cut counts them; without it the sampled tokens "
                                   "against max_turns * max_tokens.")
    overlong_penalty: float = Field(1.0, ge=0, description="Penalty at max_tokens for overlong shaping.")
    mask_truncated: bool = Field(False, description="Mask truncated completions out of the loss (multi-turn: "
                                 "trajectories a length limit ended, stop_reason length, budget or context).")
    top_entropy_frac: float = Field(1.0, gt=0, le=1, description="Train only on this top fraction of completion "
                                    "tokens by policy entropy (1 = all tokens; 0.2 = the 80/20 'forking tokens' rule).")
    ref_refresh_every: int = Field(0, ge=0, description="Mix the policy into the KL reference every k steps "
                                   "(0 = never; TRL sync_ref_model). Needs beta > 0 and kl_reference: ref.")
    ref_refresh_mix: float = Field(1.0, gt=0, le=1, description="Weight of the policy in a refresh: "
                                   "ref <- mix * policy + (1 - mix) * ref (1 = copy the policy).")
    rollout_is: Literal["none", "truncate", "mask"] = Field("none", description="Importance-sampling correction "
                                                            "of the rollout engine vs learner mismatch (stale async "
                                                            "samples, engine numerics): weight w = pi_old/pi_behaviour "
                                                            "on the policy loss; truncate = min(w, threshold) (TIS), "
                                                            "mask = drop tokens/sequences with w outside [low, "
                                                            "threshold]; none = no weight (pi_old = the behaviour "
                                                            "log-probs in async mode).")
    rollout_is_level: Literal["token", "sequence"] = Field("token", description="Importance weight per token, or "
                                                           "per sequence (product of the token ratios).")
    rollout_is_threshold: float = Field(2.0, ge=1, description="Upper bound C of the importance weight: truncate "
                                        "caps at it, mask drops ratios above it.")
    rollout_is_threshold_low: Optional[float] = Field(None, gt=0, le=1, description="mask only: drop ratios below "
                                                      "it (default 1 / rollout_is_threshold).")

    @model_validator(mode="before")
    @classmethod
    def _preset(cls, data: Any) -> Any:
        if isinstance(data, dict):
            try:
                return apply_preset(data)
            except ValueError as e:
                raise _KeyError("algo.preset", str(e)) from None
        return data

    @model_validator(mode="after")
    def _rollout_is(self) -> "AlgoConfig":
        if self.rollout_is_threshold_low is not None and self.rollout_is != "mask":
            raise _KeyError("algo.rollout_is_threshold_low", f"is the lower bound of rollout_is: mask (rollout_is "
                            f"is {self.rollout_is}); leave it unset")
        return self


class LearnerConfig(Section):
    num_learners: int = Field(1, gt=0, description="Learner ranks in one DeepSpeed data-parallel group.")
    zero_stage: int = Field(0, ge=0, le=3, description="DeepSpeed ZeRO stage.")
    lr: float = Field(2e-3, gt=0, description="Peak learning rate.")
    lr_schedule: Literal["constant", "linear", "cosine"] = Field("constant", description="Decay after warm-up.")
    warmup_steps: int = Field(0, ge=0, description="Linear warm-up steps.")
    weight_decay: float = Field(0.0, ge=0, description="AdamW weight decay.")
    betas: tuple[float, float] = Field((0.9, 0.99), description="Adam betas.")
    grad_clip: float = Field(1.0, ge=0, description="Max grad norm (0 = off).")
    micro_batch_size: int = Field(16, gt=0, description="Sequences per forward/backward per rank (gradient accumulation above it; capped at the per-rank batch).")
    micro_batch_tokens: Optional[int] = Field(
        None, gt=0, description="A token budget per micro-batch instead of a count (verl's dynamic batch size): "
        "consecutive sequences join a micro-batch while the tokens it runs through the model stay within this "
        "(packed: its completions and a prompt once per packed row; padded: rows x the longest); a longer sequence "
        "gets one of its own. Every rank runs as many micro-batches as the rank that needs most (a rank short of "
        "rows: idle ones, with zero loss). The gradient "
        "is the same as with any split (the loss is normalised by the step's global counts); "
        "learner.micro_batch_size is then unused. null: micro_batch_size sequences per micro-batch.")
    torch_adam: bool = Field(True, description="Use torch Adam in DeepSpeed (no fused-op compile; needed on CPU).")
    gradient_checkpointing: bool = Field(False, description="Recompute activations in backward.")
    packing: Literal["auto", "group", "mask", "off"] = Field(
        "auto", description="Each prompt once, its G completions after it, no padding between "
        "(grpo_dist/learner/packing.py). group: one row per micro-batch, attention computed per prompt group "
        "(learner/group_attention.py: softmax attention, sliding windows included); mask: a row per prompt group "
        "with a 4-D mask (quadratic in the row); auto: group, else mask, else padded -- each checked against the "
        "padded layout at set-up, the choice and its reason printed; off: every sequence padded to the longest.")
    pack_max_len: Optional[int] = Field(None, gt=0, description="Tokens per row of the mask layout (null: the "
                                        "model's hidden size; a row always holds one whole sequence).")
    comm_backend: Optional[str] = Field(None, description="torch.distributed backend (default gloo on CPU, nccl on GPU).")

    @field_validator("packing", mode="before")
    @classmethod
    def _off(cls, v):
        return "off" if v is False else v  # YAML 1.1 reads a bare `off` (`--learner.packing off`) as false


class SyncConfig(Section):
    transport: Literal["object_store", "filesystem", "collective"] = Field(
        "object_store", description="How the weights travel to the rollout engines. object_store / filesystem: the "
        "learner's tensors as one payload, which each engine writes and reloads from its local disk. collective: "
        "learner rank 0 broadcasts them in buckets over a process group of its own with every vLLM engine, which "
        "loads them in place (gloo and a vLLM worker extension on CPU engines; vLLM's NCCL weight transfer on "
        "GPUs); full weights, or LoRA adapters merged in the engine (rollout.adapter_mode merged).")
    bucket_mb: float = Field(256, gt=0, description="sync.transport collective: the most MiB one broadcast carries "
                           "(the learner's extra memory for a sync is at most one bucket; a larger tensor travels "
                           "alone, in slices).")
    collective_backend: Literal["auto", "nccl", "gloo"] = Field(
        "auto", description="sync.transport collective: the group's backend. auto = vLLM's NCCL weight transfer for "
        "full weights with engines and learner on GPUs, else gloo (the vLLM worker extension, which receives on the "
        "host and loads in place). gloo also serves GPU engines that share one device with the learner (NCCL refuses "
        "two ranks on one device).")
    timeout_s: float = Field(600.0, gt=0, description="sync.transport collective: the timeout of forming the weight "
                             "group and of each of its collectives (an engine that died or hangs becomes an error, "
                             "never a hang); it must exceed what an engine may still be generating when a push is "
                             "issued (trainer.max_staleness >= 1).")
    tmp_dir: Optional[str] = Field(None, description="Where workers write adapter versions (default /dev/shm or tmp).")
    keep_versions: int = Field(2, gt=0, description="Adapter versions kept on each worker's disk.")


STRATEGIES = Literal["PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"]


class ClusterConfig(Section):
    address: Optional[str] = Field(None, description="Ray address ('auto' inside a Ray job); null = start a local cluster.")
    num_cpus: Optional[int] = Field(None, gt=0, description="CPUs of the local cluster (default: all).")
    rollout_cpus: float = Field(0.5, gt=0, description="CPUs reserved per rollout actor.")
    rollout_gpus: float = Field(0.0, ge=0, description="GPUs per rollout actor.")
    reward_cpus: float = Field(0.25, gt=0, description="CPUs per reward actor.")
    learner_cpus: float = Field(0.5, gt=0, description="CPUs per learner rank.")
    learner_gpus: float = Field(0.0, ge=0, description="GPUs per learner rank.")
    layout: Literal["disaggregated", "colocated"] = Field(
        "disaggregated", description="disaggregated: each role its own placement-group bundles; colocated: learner "
        "rank i and rollout engine i share bundle i (needs rollout.num_workers == learner.num_learners; on GPU vLLM "
        "sleeps while the learner trains).")
    learner_strategy: STRATEGIES = Field("PACK", description="Placement strategy of the learner ranks' group "
                                         "(PACK keeps a DeepSpeed group close; STRICT_SPREAD one rank per node).")
    rollout_strategy: STRATEGIES = Field("PACK", description="Placement strategy of the rollout engines' group.")
    reward_strategy: STRATEGIES = Field("PACK", description="Placement strategy of the reward actors' group.")
    learner_resources: dict[str, float] = Field(default_factory=dict, description="Custom Ray resources per learner "
                                                "rank (e.g. {node_type_a100: 1}) added to its bundle.")
    rollout_resources: dict[str, float] = Field(default_factory=dict, description="Custom Ray resources per rollout actor.")
    reward_resources: dict[str, float] = Field(default_factory=dict, description="Custom Ray resources per reward actor.")
    placement_timeout_s: float = Field(300.0, gt=0, description="How long to wait for a feasible but busy cluster "
                                       "to free the bundles (what is waited for is logged); then the run stops.")
    shared_dir: Optional[str] = Field(None, description="A directory every node mounts at the same path (NFS, "
                                      "Lustre); checked at start. Needed by sync.transport filesystem and by "
                                      "full-weight training on several nodes.")
    collective_timeout_s: float = Field(1800.0, gt=0, description="Timeout of every collective between learner "
                                        "ranks (a rank that never joins becomes an error, not a hang).")
    learner_timeout_s: float = Field(3600.0, gt=0, description="The driver's wait for one learner call (a train "
                                     "step, a checkpoint); past it the rank is reported hung and the run stops.")
    torch_threads: Union[int, Literal["auto"]] = Field(
        "auto", description="torch threads inside each learner rank and hf-backend engine. auto: with "
        "trainer.max_staleness 0 the roles take turns, so a CPU learner rank gets the CPUs of its node divided by "
        "the learner ranks there; with generation "
        "overlapping the update, or on GPU, int(cluster.<role>_cpus) (at least 1): OpenMP threads competing "
        "with an engine for cores run much slower. The choice is printed at start.")
    actor_start_timeout_s: float = Field(600.0, gt=0, description="Fail if actors are not up by then (unsatisfiable resources).")
    heartbeat_interval_s: float = Field(5.0, gt=0, description="While the driver waits on an actor call, it "
                                        "asks each actor it waits on for a heartbeat this often (answered in its "
                                        "own thread; it also reports an engine process stopped or gone).")
    heartbeat_timeout_s: float = Field(60.0, gt=0, description="An actor whose heartbeat stays unanswered this "
                                       "long is hung (a stopped process): a rollout or reward actor is replaced, a "
                                       "learner rank stops the run. The call timeouts stay the outer bound.")
    max_restarts: int = Field(3, ge=0, description="Dead rollout/reward actors replaced per run (work re-issued, "
                              "weights restored) before the run stops; a dead learner always stops it.")

    _threads = field_validator("torch_threads")(classmethod(lambda cls, v: _int_or_auto(v, 1)))


class LoggingConfig(Section):
    wandb_mode: Literal["online", "offline", "disabled"] = Field(
        "offline", description="W&B mode: offline (files under output_dir/wandb, uploaded later with `wandb sync`), "
        "online (the key from WANDB_API_KEY or `wandb login`, checked before the run starts; W&B out of reach: offline, "
        "said in one line) or disabled.")
    project: str = Field("grpo_dist", description="W&B project.")
    entity: Optional[str] = Field(None, description="W&B entity.")
    run_name: Optional[str] = Field(None, description="W&B run name.")
    sample_table_every: int = Field(5, ge=0, description="Log a table of sample completions every k steps (0 = never).")
    sample_table_rows: int = Field(8, gt=0, description="Rows in that table.")
    progress: bool = Field(True, description="Show a rich progress bar.")
    verbose: bool = Field(False, description="Print what the actors print (vLLM, Ray, DeepSpeed warnings, progress "
                          "bars) on the console; by default it goes to <output_dir>/workers.log "
                          "(grpo-dist train --verbose).")


class CheckpointConfig(Section):
    dir: Optional[str] = Field(None, description="Checkpoint directory (default <output_dir>/checkpoints).")
    every: int = Field(10, ge=0, description="Checkpoint every k steps (0 = only at the end).")
    keep: int = Field(2, gt=0, description="Checkpoints kept.")
    resume: Optional[str] = Field(None, description="'auto' (latest in dir) or a checkpoint path.")


class TrainerConfig(Section):
    steps: int = Field(30, gt=0, description="Training steps (one batch of prompts each).")
    seed: int = Field(0, description="Global seed.")
    run_id: Optional[str] = Field(None, description="Run id (default: made at start and kept in "
                                  "<output_dir>/run.json, so a resumed run keeps it); names the W&B run and the "
                                  "run's directory under cluster.shared_dir.")
    max_minutes: Optional[float] = Field(None, gt=0, description="A time budget for the training steps (this "
                                         "process, from the first step on; evaluation before training not counted): "
                                         "no step starts that would end past it at the mean step time so far; the run "
                                         "then finishes as after trainer.steps (evaluation after, final adapter, "
                                         "summary with stopped: max_minutes). null = no budget.")
    eval_every: int = Field(0, ge=0, description="Evaluate every k steps (0 = only before and after).")
    eval_before_after: bool = Field(True, description="Evaluate held-out accuracy before and after training.")
    max_staleness: Union[int, Literal["auto"]] = Field(
        "auto", description="Bounded-staleness pipeline: how many adapter versions older than the learner a training "
        "sample may be. 0 = strictly on-policy (generate, then learn); k >= 1 = generation runs k / "
        "algo.num_iterations steps ahead of the learner and the ratio uses the rollout engine's log-probs as pi_old. "
        "A multiple of algo.num_iterations (each step adds that many versions). auto = one step ahead where engines "
        "and learner have GPUs of their own (disaggregated), else 0: roles that share CPU cores slow each other down "
        "(the choice and its reason are printed at start).")
    async_rollouts: bool = Field(False, description="Alias of max_staleness = algo.num_iterations (one step ahead); "
                                 "set to true by the config whenever max_staleness >= 1.")
    dispatch_chunk: int = Field(0, ge=0, description="Prompts per generation request to one rollout engine; each "
                                "chunk goes to the engine with the fewest outstanding prompts. 0 = one chunk per "
                                "engine and batch (vLLM batches a whole chunk at once).")
    _auto_staleness: Optional[str] = PrivateAttr(None)  # why max_staleness auto chose what it chose

    _k = field_validator("max_staleness")(classmethod(lambda cls, v: _int_or_auto(v, 0)))


RESERVED_EVAL_NAMES = ("reward", "main")  # eval/reward/<fn> is taken; main is the data.eval_path set


class EvalConfig(Section):
    samples_per_prompt: int = Field(4, gt=0, description="n samples per prompt for pass@k / sampled accuracy.")
    pass_k: list[int] = Field(default_factory=lambda: [1, 4], description="k values for pass@k.")
    temperature: Optional[float] = Field(None, gt=0, description="Sampling temperature (default rollout.temperature).")
    greedy: bool = Field(True, description="Also report greedy accuracy.")
    before: bool = Field(True, description="Evaluate the base model before training too; false: only after training "
                         "(the base's figures are known from an earlier run or `grpo-dist eval`, and the base model "
                         "evaluates slowly: long answers). trainer.eval_before_after: false turns off both.")
    reuse_base: bool = Field(True, description="Reuse a recorded evaluation of the base model (by `grpo-dist eval` "
                             "or an earlier training) whose model files, held-out sets, sampling, rewards and "
                             "evaluation code are the same (the training seed is not part of it), instead of "
                             "evaluating it again; a line says so. Records: $GRPO_DIST_EVAL_CACHE, else "
                             "<project cache>/evals (GRPO_DIST_EVAL_CACHE=off: none). false: evaluate (and record).")
    extra: dict[str, str] = Field(
        default_factory=dict, description="More held-out sets, evaluated before and after training like the main one "
        "and by `grpo-dist eval`: name -> source (same formats as data.eval_path; a builtin's eval split, "
        "e.g. {ood: 'builtin:word_problems_ood?n=256'}), at most data.eval_size prompts each; reported per set "
        "(eval/<name>/... in W&B, eval_sets in summary.json).")

    @field_validator("extra")
    @classmethod
    def _extra_names(cls, v: dict[str, str]) -> dict[str, str]:
        for name, source in v.items():
            if not re.fullmatch(r"[A-Za-z0-9_-]+", name) or name in RESERVED_EVAL_NAMES:
                raise ValueError(f"set name {name!r}: use letters, digits, _ or - (not {', '.join(RESERVED_EVAL_NAMES)})")
            if not str(source).strip():
                raise ValueError(f"set {name!r}: empty source")
        return v
