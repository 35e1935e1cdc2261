"""The learner: a DeepSpeed engine over the base model + a PEFT LoRA adapter (or all weights).

A plain class (``cluster/`` wraps it as a Ray actor); everything it returns pickles: dataclasses
from ``types.py`` and dicts of floats. One instance per data-parallel rank; each gets its
contiguous shard of the batch (``TrainBatch.shard(rank, world)``).

Loss normalisation: every micro-batch's loss is aggregated with the *global* counts (completion
tokens / sequences summed over all micro-batches and ranks), so the sum over micro-batches and
ranks is exactly the single-process whole-batch loss. DeepSpeed averages gradients over ranks,
so ``engine.backward(loss * world_size, scale_wrt_gas=False)`` makes the final gradient the
gradient of that whole-batch loss (no division by the accumulation steps either).
"""

from __future__ import annotations

import contextlib
import datetime
import os
import time
from typing import Any, Optional

import torch

from grpo_dist.algo import entropy_from_logits, masked_mean, rollout_is_weights, selective_log_softmax
from grpo_dist.config import Config
from grpo_dist.devices import learner_on_gpu
from grpo_dist.types import TrainBatch

from .batching import Collated, collate, gather_completion, micro_batch_rows
from . import group_attention
from .packing import check_packing, collate_packed, packed_token_values
from .loss import compute_loss
from .optim import deepspeed_config, gradient_accumulation_steps, make_scheduler_factory
from .reference import Reference
from .state import MetricAccumulator, all_reduce_floats, global_norm
from .weight_group import WeightBroadcast
from .weights_io import WeightsIO


class Learner(WeightsIO, WeightBroadcast):
    """DeepSpeed + PEFT GRPO learner (one data-parallel rank)."""

    def __init__(self, cfg: Config, rank: int = 0, world_size: int = 1, master_addr: str = "127.0.0.1",
                 master_port: int = 29500, local_rank: Optional[int] = None):
        self.cfg = cfg
        self.rank, self.world_size = int(rank), int(world_size)
        self.master_addr, self.master_port = master_addr, int(master_port)
        self.local_rank = local_rank
        self.engine = None
        self.device = torch.device("cpu")
        self.reference: Optional[Reference] = None
        self._transport = None  # sync.transport, made on the first publish_update
        self._version = 0
        self._pad_id = 0
        self._gas = 1
        self._packing = "off"  # learner.packing as decided at set-up: "group" | "mask" | "off" (padded)
        self._pack_len = 0  # the "mask" layout's row length
        self._attn_original: Optional[str] = None  # the attention implementation group attention wraps
        self._mask_dtype = torch.float32
        # Source of old_logp (pi_old), the ratio's denominator. "policy": the learner's own log-probs
        # under the current weights before the update (the proximal policy): logp.detach() when
        # num_iterations == 1 (ratio 1), else recomputed once, no grad, before the first update.
        # "behaviour": the rollout engine's log-probs (batch.behaviour_logprobs), so the clipped ratio
        # itself is the importance-sampling correction of stale (async) rollouts. With
        # algo.rollout_is != none pi_old is always "policy" and the mismatch pi_old / pi_behaviour
        # is corrected by separate, bounded weights on the policy loss (decoupled PPO; see
        # grpo_dist.algo.rollout_is).
        self.old_logp_source = ("behaviour" if cfg.trainer.async_rollouts and cfg.algo.rollout_is == "none"
                                else "policy")

    # ------------------------------------------------------------------ setup
    def setup(self) -> dict[str, Any]:
        import deepspeed
        from transformers import AutoModelForCausalLM

        cfg = self.cfg
        cuda = learner_on_gpu(cfg)  # cluster.learner_gpus decides, not torch.cuda.is_available()
        local = self.local_rank if self.local_rank is not None else (
            self.rank % max(1, torch.cuda.device_count()) if cuda else self.rank)
        os.environ.update(RANK=str(self.rank), WORLD_SIZE=str(self.world_size), LOCAL_RANK=str(local),
                          MASTER_ADDR=self.master_addr, MASTER_PORT=str(self.master_port))
        if cuda:
            torch.cuda.set_device(local)
            self.device = torch.device("cuda", local)
        torch.manual_seed(cfg.trainer.seed)
        backend = cfg.learner.comm_backend or ("nccl" if cuda else "gloo")
        t0 = time.perf_counter()
        # a rank that never joins (or dies mid-collective) becomes an error after this, not a hang
        timeout = datetime.timedelta(seconds=cfg.cluster.collective_timeout_s)
        deepspeed.init_distributed(dist_backend=backend, auto_mpi_discovery=False, verbose=False, timeout=timeout)
        t_dist = time.perf_counter() - t0

        model = AutoModelForCausalLM.from_pretrained(
            cfg.model.path, dtype=getattr(torch, cfg.model.dtype), trust_remote_code=cfg.model.trust_remote_code)
        model.config.use_cache = False
        pad = model.config.pad_token_id
        if pad is None:
            eos = model.config.eos_token_id
            pad = (eos[0] if isinstance(eos, list) else eos) or 0
        self._pad_id = int(pad)  # any id works: padded positions are masked out
        if cfg.learner.gradient_checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        if cfg.lora.enabled:
            from peft import LoraConfig, get_peft_model

            lcfg = LoraConfig(r=cfg.lora.r, lora_alpha=cfg.lora.alpha, lora_dropout=cfg.lora.dropout,
                              target_modules=list(cfg.lora.target_modules), task_type="CAUSAL_LM")
            model = get_peft_model(model, lcfg)
        self.reference = Reference(model, lora=cfg.lora.enabled, needs_copy=self._needs_ref(), device=self.device)
        params = [p for p in model.parameters() if p.requires_grad]
        self._gas = gradient_accumulation_steps(cfg, self.world_size)
        self.engine, _, _, _ = deepspeed.initialize(
            model=model, model_parameters=params, config=deepspeed_config(cfg, self.world_size),
            lr_scheduler=make_scheduler_factory(cfg))
        self.engine.train()
        self.device = self.engine.device if cuda else self.device
        self._mask_dtype = getattr(torch, cfg.model.dtype)
        self._packing, self._pack_len, self.packing_line = check_packing(self, self.engine.module.config)
        if self.rank == 0:
            print(self.packing_line, flush=True)
        total = sum(self._numel(p) for p in self.engine.module.parameters())
        trainable = sum(self._numel(p) for p in self.engine.module.parameters() if p.requires_grad)
        return {"trainable_params": int(trainable), "total_params": int(total),
                "adapter_bytes": int(sum(self._numel(p) * p.element_size() for p in self._trainable())),
                "gradient_accumulation_steps": self._gas, "world_size": self.world_size,
                "packing": self._packing, "packed_row_len": self._pack_len,
                "timing/init_distributed": t_dist, "timing/setup": time.perf_counter() - t0}

    @staticmethod
    def _numel(p: torch.Tensor) -> int:
        return int(getattr(p, "ds_numel", p.numel()))  # ZeRO-3 partitions keep the full size here

    def _trainable(self) -> list[torch.nn.Parameter]:
        return [p for p in self.engine.module.parameters() if p.requires_grad]

    def _needs_ref(self) -> bool:
        return self.cfg.algo.beta > 0 and self.cfg.algo.kl_reference == "ref"

    def _require_setup(self) -> None:
        if self.engine is None:
            raise RuntimeError("Learner.setup() must be called first")

    @property
    def version(self) -> int:
        """Optimizer steps applied so far (0 = the initial adapter)."""
        return self._version

    # ------------------------------------------------------------------ forward passes
    def _forward(self, mb: Collated, module=None, entropy: bool = False):
        """Log-probs ``[B, C]`` (temperature-scaled, fp32) of the completion tokens; optional entropy."""
        module = module if module is not None else self.engine
        temperature = self.cfg.rollout.temperature
        if mb.packed:
            groups = {} if mb.groups is None else {group_attention.KWARG: mb.groups}
            logits = module(input_ids=mb.input_ids, attention_mask=mb.attention_mask, position_ids=mb.position_ids,
                            use_cache=False, **groups).logits
            return packed_token_values(logits / temperature if temperature != 1.0 else logits, mb, entropy)
        out = module(input_ids=mb.input_ids, attention_mask=mb.attention_mask,
                     logits_to_keep=mb.logits_to_keep, use_cache=False)
        logits = out.logits[:, :-1]
        if temperature != 1.0:
            logits = logits / temperature
        logp = gather_completion(selective_log_softmax(logits, mb.targets()), mb.index, mb.valid)
        ent = None
        if entropy:
            with torch.no_grad():
                ent = gather_completion(entropy_from_logits(logits.detach()), mb.index, mb.valid)
        return logp, ent

    @contextlib.contextmanager
    def _eval_mode(self):
        module = self.engine.module
        was = module.training
        module.eval()
        try:
            yield
        finally:
            module.train(was)

    @torch.no_grad()
    def _logprobs_nograd(self, mb: Collated, reference: bool = False) -> torch.Tensor:
        with self._eval_mode():
            if not reference:
                return self._forward(mb, self.engine.module)[0]
            with self.reference.active(self.engine.module) as ref:
                return self._forward(mb, ref)[0]

    def _collate(self, batch: TrainBatch, rows: Optional[range] = None, packed=None) -> Collated:
        """``packed``: None = the layout chosen at set-up; False = padded; True = packed (the chosen
        packing, "mask" if none); or a layout name."""
        mode = (self._packing if packed is None or packed is True else "off" if packed is False else packed)
        if packed is True and mode == "off":
            mode = "mask"
        if mode == "off":
            return collate(batch, rows, self._pad_id).to(self.device)
        return collate_packed(batch, rows, self._pad_id, self._pack_len or 1, self._mask_dtype,
                              group=mode == "group").to(self.device)

    def _group_attention(self, on: bool) -> None:
        """Switch the policy (and a full-weight reference copy) to group attention, or back."""
        models = [self.engine.module] + ([self.reference.model] if self.reference and self.reference.model else [])
        if on:
            self._attn_original = [group_attention.enable(m) for m in models][0]
        elif self._attn_original is not None:
            for m in models:
                group_attention.disable(m, self._attn_original)
            self._attn_original = None

    def compute_logprobs(self, batch: TrainBatch) -> list[list[float]]:
        """Per-completion-token log-probs under the current adapter (temperature-scaled), no grad."""
        self._require_setup()
        out: list[list[float]] = []
        mbs = self.cfg.learner.micro_batch_size
        for lo in range(0, len(batch), mbs):
            mb = self._collate(batch, range(lo, min(len(batch), lo + mbs)))
            logp = self._logprobs_nograd(mb).cpu()
            out += [logp[r, :n].tolist() for r, n in enumerate(mb.lengths)]
        return out

    def _loss(self, logp, old_logp, ref_logp, mb: Collated, global_tokens, global_seqs, is_weights=None):
        max_len = self.cfg.algo.max_len or self.cfg.rollout.max_tokens
        return compute_loss(self.cfg.algo, logp, old_logp, ref_logp, mb.advantages, mb.mask, max_len=max_len,
                            global_tokens=global_tokens, global_seqs=global_seqs, is_weights=is_weights)

    def _is_weights(self, old_logp: torch.Tensor, mb: Collated) -> tuple[torch.Tensor, dict[str, float]]:
        """Rollout importance weights ``[B, C]`` of one micro-batch: pi_old (``old_logp``) vs the
        rollout engine's log-probs, bounded as ``algo.rollout_is*`` says."""
        a = self.cfg.algo
        return rollout_is_weights(old_logp, mb.behaviour_logp, mb.mask, a.rollout_is, a.rollout_is_level,
                                  a.rollout_is_threshold, a.rollout_is_threshold_low)

    def _all_reduce_sum(self, values: list[float]) -> list[float]:
        if self.world_size == 1:
            return values
        return all_reduce_floats(values, "sum")  # on the backend's device (CUDA for NCCL)

    # ------------------------------------------------------------------ training
    def train_step(self, batch: TrainBatch) -> dict[str, float]:
        """``algo.num_iterations`` optimizer steps on this rank's shard; returns ``train/*`` metrics."""
        self._require_setup()
        a = self.cfg.algo
        t0 = time.perf_counter()
        if len(batch.advantages) != len(batch):
            raise ValueError(f"batch has {len(batch)} completions but {len(batch.advantages)} advantages")
        micro = [self._collate(batch, r) for r in micro_batch_rows(len(batch), self._gas)]
        selected = self._keep_high_entropy(micro, a.top_entropy_frac) if a.top_entropy_frac < 1.0 else None
        local_tokens = float(sum(float(mb.mask.sum()) for mb in micro))
        global_tokens, global_seqs = self._all_reduce_sum([local_tokens, float(len(batch))])
        t1 = time.perf_counter()

        ref = [self._logprobs_nograd(mb, reference=True) for mb in micro] if self._needs_ref() else None
        use_is = a.rollout_is != "none"
        if (self.old_logp_source == "behaviour" or use_is) and any(mb.behaviour_logp is None for mb in micro):
            need = ("old_logp_source='behaviour'" if self.old_logp_source == "behaviour"
                    else f"algo.rollout_is={a.rollout_is}")
            raise ValueError(f"{need} needs behaviour_logprobs for every completion")
        if self.old_logp_source == "behaviour":
            old = [mb.behaviour_logp for mb in micro]
        elif a.num_iterations > 1:
            old = [self._logprobs_nograd(mb) for mb in micro]
        else:
            old = None  # logp.detach() per micro-batch: ratio 1, on-policy gradient
        # IS weights: fixed for the step (pi_old does not move between iterations); with old None they
        # are made from the first iteration's logp.detach(), micro-batch by micro-batch
        is_w: list = [None] * len(micro)
        t2 = time.perf_counter()

        acc = MetricAccumulator()
        grad_norms: list[float] = []
        lr = float(self.engine.get_lr()[0])
        for it in range(a.num_iterations):
            for i, mb in enumerate(micro):
                logp, ent = self._forward(mb, entropy=(it == 0))
                old_i = old[i] if old is not None else logp.detach()
                ref_i = ref[i] if ref is not None else (old_i if a.kl_reference == "old" and a.beta > 0 else None)
                tokens = float(mb.mask.sum())
                if use_is and is_w[i] is None:
                    is_w[i], is_metrics = self._is_weights(old_i, mb)
                    acc.add(is_metrics, tokens)
                loss, metrics = self._loss(logp, old_i, ref_i, mb, global_tokens, global_seqs, is_w[i])
                acc.add(metrics, tokens)
                if it == 0:
                    self._diagnostics(acc, logp.detach(), ent, mb)
                self.engine.backward(loss * self.world_size, scale_wrt_gas=False)
                if i == len(micro) - 1 and self.cfg.learner.zero_stage == 0:
                    grad_norms.append(global_norm(self._full_grads()))
                self.engine.step()
            self._version += 1
            gn = self.engine.get_global_grad_norm()
            if gn is not None and len(grad_norms) < it + 1:
                grad_norms.append(float(gn))
        t3 = time.perf_counter()

        out = acc.reduce(self.world_size, a.num_iterations)
        out.update({
            "train/grad_norm": sum(grad_norms) / len(grad_norms) if grad_norms else float("nan"),
            "train/lr": lr, "train/tokens": global_tokens, "train/sequences": global_seqs,
            "train/version": float(self._version),
            **({"train/ref_refreshes": float(self.reference.refreshes)} if self.cfg.algo.ref_refresh_every else {}),
            **({"train/entropy_selected_frac": selected} if selected is not None else {}),
            # NaN/inf here means the update broke the weights: the driver stops before syncing them
            **({"train/param_norm": global_norm(self._trainable())} if self.cfg.learner.zero_stage < 3 else {}),
            "timing/learn_prepare": t1 - t0, "timing/learn_ref_old": t2 - t1,
            "timing/learn_update": t3 - t2, "timing/learn_total": time.perf_counter() - t0,
        })
        return out

    @torch.no_grad()
    def _keep_high_entropy(self, micro: list[Collated], frac: float) -> float:
        """Narrow every micro-batch's loss mask to the ``frac`` highest-entropy completion tokens of
        the *whole* batch (one no-grad policy pass; with several ranks the threshold is the quantile
        of every rank's entropies, so the selection equals the single-process one); returns the
        fraction of tokens kept."""
        with self._eval_mode():
            ents = [self._forward(mb, self.engine.module, entropy=True)[1] for mb in micro]
        pool = torch.cat([e[mb.mask.bool()] for e, mb in zip(ents, micro)]).float().cpu()
        if self.world_size > 1:
            import torch.distributed as dist

            parts: list = [None] * self.world_size
            dist.all_gather_object(parts, pool)
            pool = torch.cat(parts)
        if pool.numel() == 0:
            return 0.0
        threshold = torch.quantile(pool, 1.0 - frac).to(ents[0].device)
        for e, mb in zip(ents, micro):
            mb.mask = mb.mask * (e >= threshold).to(mb.mask.dtype)
        kept = self._all_reduce_sum([float(sum(float(mb.mask.sum()) for mb in micro))])[0]
        return kept / float(pool.numel())

    def _diagnostics(self, acc: MetricAccumulator, logp, ent, mb: Collated) -> None:
        m = mb.mask.bool()
        n = float(m.sum())
        if ent is not None and n > 0:
            acc.add_weighted("entropy", float(masked_mean(ent, m)), n)
        if mb.behaviour_logp is not None:
            v = mb.valid
            nv = float(v.sum())
            if nv > 0:
                diff = torch.where(v, (logp - mb.behaviour_logp).abs(), torch.zeros((), dtype=logp.dtype))
                acc.add({"logprob_diff_behaviour_max": float(diff.max())}, nv)
                acc.add_weighted("logprob_diff_behaviour_mean", float(diff.sum()) / nv, nv)

    def _full_grads(self) -> list[Optional[torch.Tensor]]:
        """Gradients at the accumulation boundary, before clipping and the optimizer step (for the
        grad-norm metric on ZeRO stage 0, where DeepSpeed does not record the norm)."""
        from deepspeed.utils import safe_get_full_grad

        return [safe_get_full_grad(p) for p in self._trainable()]

    def refresh_reference(self, mix: Optional[float] = None) -> dict[str, float]:
        """Mix the current policy into the KL reference (``algo.ref_refresh_mix`` unless given);
        every rank must call it. The policy and the rollout workers are untouched."""
        self._require_setup()
        mix = self.cfg.algo.ref_refresh_mix if mix is None else float(mix)
        self.reference.refresh(self.engine.module, mix, self._gathered)
        return {"train/ref_refreshes": float(self.reference.refreshes), "train/ref_rank": float(self.reference.rank)}

    def shutdown(self) -> None:
        """Drop the engine and destroy the process group (through DeepSpeed, which also forgets its
        cached world-group clone, so a later ``setup()`` in this process can initialise again)."""
        import torch.distributed as dist

        self.engine = None
        self.reference = None
        if dist.is_available() and dist.is_initialized():
            import deepspeed.comm

            deepspeed.comm.destroy_process_group()
