"""TRL's and verl's option names, and this project's names for the same things.

One table (:data:`ROWS`) feeds both the docs' "Coming from TRL or verl" table (docs/coming-from-trl-verl.md)
(:func:`markdown_table`) and the config error for an unknown key that is a TRL or verl name
(:func:`hint`: ``num_generations: unknown key: this is rollout.group_size (TRL)``); an unknown key
that is none gets the closest key of ours (``trainer.step: unknown key; did you mean
trainer.steps?``). Imports nothing but the standard library.
"""

from __future__ import annotations

import difflib
from typing import Iterable

# (our key, TRL names (GRPOConfig, TrainingArguments, TRL's script arguments), verl names (its
# ppo_trainer.yaml, dotted), note). TRL names are bare; verl names are full dotted paths.
ROWS: list[tuple[str, tuple[str, ...], tuple[str, ...], str]] = [
    ("model.path", ("model_name_or_path",), ("actor_rollout_ref.model.path",), ""),
    ("model.dtype", ("bf16", "torch_dtype", "dtype"), (), "bfloat16 / float16 / float32"),
    ("lora.enabled", ("use_peft",), (), ""),
    ("lora.r", ("lora_r",), ("actor_rollout_ref.model.lora_rank",), ""),
    ("lora.alpha", ("lora_alpha",), ("actor_rollout_ref.model.lora_alpha",), ""),
    ("lora.dropout", ("lora_dropout",), (), ""),
    ("lora.target_modules", ("lora_target_modules",), ("actor_rollout_ref.model.target_modules",), ""),
    ("data.path", ("dataset_name",), ("data.train_files",), "hf:<name> for a hub dataset"),
    ("data.split", ("dataset_train_split",), (), ""),
    ("data.eval_path", (), ("data.val_files",), ""),
    ("data.eval_split", ("dataset_test_split",), (), ""),
    ("data.prompt_column", (), ("data.prompt_key",), ""),
    ("data.max_prompt_tokens", ("max_prompt_length",), ("data.max_prompt_length",), ""),
    ("data.shuffle", ("shuffle_dataset",), ("data.shuffle",), ""),
    ("rollout.group_size", ("num_generations",), ("actor_rollout_ref.rollout.n",), "G, completions per prompt"),
    ("rollout.prompts_per_step", ("generation_batch_size",), ("data.train_batch_size",),
     "prompts per step; a step trains on prompts_per_step x group_size completions"),
    ("rollout.max_tokens", ("max_completion_length",), ("data.max_response_length",), ""),
    ("rollout.temperature", ("temperature",), ("actor_rollout_ref.rollout.temperature",), ""),
    ("rollout.top_p", ("top_p",), ("actor_rollout_ref.rollout.top_p",), ""),
    ("rollout.top_k", ("top_k",), ("actor_rollout_ref.rollout.top_k",), "-1 = off"),
    ("rollout.backend", ("use_vllm",), ("actor_rollout_ref.rollout.name",), "vllm or hf"),
    ("rollout.gpu_memory_utilization", ("vllm_gpu_memory_utilization",),
     ("actor_rollout_ref.rollout.gpu_memory_utilization",), ""),
    ("rollout.streaming", (), ("actor_rollout_ref.rollout.mode",), "verl's async mode"),
    ("reward.functions", ("reward_funcs", "reward_weights"),
     ("custom_reward_function.path", "custom_reward_function.name"),
     "a list of {fn: path.py:name, weight: w}; TRL's reward_weights are the entries' weight"),
    ("algo.beta", ("beta",), ("actor_rollout_ref.actor.kl_loss_coef", "actor_rollout_ref.actor.use_kl_loss"),
     "KL coefficient; 0 = no KL term"),
    ("algo.kl_kind", (), ("actor_rollout_ref.actor.kl_loss_type",), "k1, k2, k3 (TRL's), low_var_kl (verl's default)"),
    ("algo.clip_low", ("epsilon",), ("actor_rollout_ref.actor.clip_ratio", "actor_rollout_ref.actor.clip_ratio_low"),
     "ratio >= 1 - clip_low; a symmetric clip (verl's clip_ratio) sets clip_high too"),
    ("algo.clip_high", ("epsilon_high",), ("actor_rollout_ref.actor.clip_ratio_high",), ""),
    ("algo.dual_clip", (), ("actor_rollout_ref.actor.clip_ratio_c",), ""),
    ("algo.agg", ("loss_type",), ("actor_rollout_ref.actor.loss_agg_mode",),
     "TRL grpo = seq-mean-token-mean, dr_grpo = seq-mean-token-sum-norm, dapo / bnpo = token-mean; verl's "
     "values are ours (or algo.preset: grpo, dr_grpo, dapo)"),
    ("algo.ratio_level", ("importance_sampling_level",), ("actor_rollout_ref.actor.policy_loss.loss_mode",),
     "token, or sequence (GSPO; verl loss_mode gspo; algo.preset gspo)"),
    ("algo.adv_estimator", (), ("algorithm.adv_estimator",), "group (verl grpo), rloo, softmax"),
    ("algo.adv_scale", ("scale_rewards",), ("algorithm.norm_adv_by_std_in_grpo",),
     "group (TRL true), batch, none (TRL false, verl false)"),
    ("algo.num_iterations", ("num_iterations",), ("actor_rollout_ref.actor.ppo_epochs",), ""),
    ("algo.mask_truncated", ("mask_truncated_completions",), (), ""),
    ("algo.top_entropy_frac", ("top_entropy_quantile",), (), ""),
    ("algo.ref_refresh_every", ("sync_ref_model", "ref_model_sync_steps"), (), "0 = never"),
    ("algo.ref_refresh_mix", ("ref_model_mixup_alpha",), (), ""),
    ("algo.rollout_is", ("vllm_importance_sampling_correction",), ("algorithm.rollout_is_mode",),
     "none, truncate (TRL's correction), mask"),
    ("algo.rollout_is_threshold", ("vllm_importance_sampling_cap",), ("algorithm.rollout_is_threshold",), ""),
    ("algo.rollout_is_level", (), ("algorithm.rollout_is_level",), ""),
    ("learner.lr", ("learning_rate",), ("actor_rollout_ref.actor.optim.lr",), ""),
    ("learner.lr_schedule", ("lr_scheduler_type",), (), "constant, linear, cosine"),
    ("learner.warmup_steps", ("warmup_steps",), ("actor_rollout_ref.actor.optim.lr_warmup_steps",), ""),
    ("learner.weight_decay", ("weight_decay",), ("actor_rollout_ref.actor.optim.weight_decay",), ""),
    ("learner.betas", ("adam_beta1", "adam_beta2"), (), "[beta1, beta2]"),
    ("learner.grad_clip", ("max_grad_norm",), ("actor_rollout_ref.actor.grad_clip",), ""),
    ("learner.micro_batch_size", ("per_device_train_batch_size", "gradient_accumulation_steps"),
     ("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu",), "sequences per forward/backward per rank; "
     "gradient accumulation = the step's batch / micro_batch_size"),
    ("learner.micro_batch_tokens", (), ("actor_rollout_ref.actor.ppo_max_token_len_per_gpu",
                                        "actor_rollout_ref.actor.use_dynamic_bsz"),
     "a token budget per micro-batch (set it to turn dynamic micro-batches on)"),
    ("learner.gradient_checkpointing", ("gradient_checkpointing",),
     ("actor_rollout_ref.model.enable_gradient_checkpointing",), ""),
    ("trainer.steps", ("max_steps", "num_train_epochs"), ("trainer.total_training_steps", "trainer.total_epochs"),
     "steps, not epochs: the prompts repeat, reshuffled, as long as it runs"),
    ("trainer.seed", ("seed",), (), ""),
    ("trainer.eval_every", ("eval_steps",), ("trainer.test_freq",), ""),
    ("trainer.eval_before_after", (), ("trainer.val_before_train",), ""),
    ("checkpoint.every", ("save_steps",), ("trainer.save_freq",), ""),
    ("checkpoint.keep", ("save_total_limit",), (), ""),
    ("checkpoint.resume", ("resume_from_checkpoint",), ("trainer.resume_mode",), "auto or a checkpoint path"),
    ("checkpoint.dir", (), ("trainer.default_local_dir",), "default <output_dir>/checkpoints"),
    ("logging.wandb_mode", ("report_to",), ("trainer.logger",), "online, offline, disabled"),
    ("logging.project", (), ("trainer.project_name",), ""),
    ("logging.run_name", ("run_name",), ("trainer.experiment_name",), ""),
    ("cluster.learner_gpus", (), ("trainer.n_gpus_per_node",), "GPUs per actor: cluster.learner_gpus and "
     "cluster.rollout_gpus"),
]

ALIASES: dict[str, tuple[str, str, str]] = {}  # foreign name -> (our key, "TRL" | "verl", note)
for _ours, _trl, _verl, _note in ROWS:
    for _name in _trl:
        ALIASES.setdefault(_name, (_ours, "TRL", _note))
    for _name in _verl:
        ALIASES.setdefault(_name, (_ours, "verl", _note))


def hint(key: str, ours: Iterable[str]) -> str:
    """What follows ``<key>: unknown key`` in the error: ``: this is rollout.group_size (TRL)`` for
    a TRL or verl name, ``; did you mean trainer.steps?`` for a near miss of one of ``ours`` (every
    dotted config key), else ''."""
    ours = list(ours)
    sections = {k.split(".")[0] for k in ours}
    parts = key.split(".")
    candidates = [key] + ([".".join(parts[1:])] if parts[0] in sections and len(parts) > 1 else []) + [parts[-1]]
    for name in candidates:
        if name in ALIASES:
            target, origin, note = ALIASES[name]
            return f": this is {target} ({origin}{'; ' + note if note else ''})"
    leaf = parts[-1]
    if len(parts) > 1 and parts[0] in sections:  # a near miss within its own section first
        fields = [k.split(".", 1)[1] for k in ours if k.startswith(parts[0] + ".")]
        close = difflib.get_close_matches(leaf, fields, n=1, cutoff=0.6)
        if close:
            return f"; did you mean {parts[0]}.{close[0]}?"
    same_leaf = [k for k in ours if k.split(".")[-1] == leaf]
    if same_leaf:  # the right name in another section
        return f"; did you mean {same_leaf[0]}?"
    close = difflib.get_close_matches(key, ours + sorted(sections), n=1, cutoff=0.6)
    return f"; did you mean {close[0]}?" if close else ""


def markdown_table() -> str:
    """The docs' option table: our key, TRL's names, verl's names, a note."""
    lines = ["| grpo_dist | TRL | verl | note |", "|---|---|---|---|"]
    for ours, trl, verl, note in ROWS:
        names = lambda xs: ", ".join(f"`{x}`" for x in xs)
        lines.append(f"| `{ours}` | {names(trl)} | {names(verl)} | {note} |")
    return "\n".join(lines)
