"""The policy of one learner rank: the DeepSpeed engine over the base model + a PEFT LoRA adapter
(or all weights), its KL reference, and the forward passes over a collated micro-batch.

``PolicyModel.build`` joins the process group and makes the model from the config; everything
else in ``grpo_dist.learner`` runs on what it holds.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import time
from typing import Optional

import torch

from grpo_dist.algo import entropy_from_logits, selective_log_softmax
from grpo_dist.config import Config
from grpo_dist.devices import learner_on_gpu, trainable_dtype

from . import group_attention
from .batching import Collated, gather_completion
from .dist_init import init_process_group
from .optim import deepspeed_config, gradient_accumulation_steps, make_scheduler_factory
from .packing import kept_token_values, packed_token_values
from .reference import Reference


def numel(p: torch.Tensor) -> int:
    return int(getattr(p, "ds_numel", p.numel()))  # ZeRO-3 partitions keep the full size here


def join_group(cfg: Config, rank: int, world_size: int, master_addr: str, master_port: int,
               local_rank: Optional[int]) -> tuple[torch.device, float]:
    """Join the learners' process group (``RANK`` ... ``MASTER_PORT`` set here) on the device
    ``cluster.learner_gpus`` decides (not ``torch.cuda.is_available()``); the device and seconds taken."""
    cuda = learner_on_gpu(cfg)
    local = local_rank if local_rank is not None else (
        rank % max(1, torch.cuda.device_count()) if cuda else rank)
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_RANK=str(local),
                      MASTER_ADDR=master_addr, MASTER_PORT=str(master_port))
    device = torch.device("cpu")
    if cuda:
        torch.cuda.set_device(local)
        device = torch.device("cuda", local)
    torch.manual_seed(cfg.trainer.seed)
    backend = cfg.learner.comm_backend or ("nccl" if cuda else "gloo")
    t0 = time.perf_counter()
    # a rank that never joins (or dies mid-collective) becomes an error after this, not a hang
    timeout = datetime.timedelta(seconds=cfg.cluster.collective_timeout_s)
    init_process_group(backend, timeout)  # DeepSpeed's C++ shm op is neither compiled nor loaded
    return device, time.perf_counter() - t0


def load_base(cfg: Config) -> tuple[torch.nn.Module, int]:
    """The base model (``model.path`` in ``model.dtype``, no KV cache, gradient checkpointing as
    asked) and the pad id the micro-batches use."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(
        cfg.model.path, dtype=getattr(torch, cfg.model.dtype), trust_remote_code=cfg.model.trust_remote_code)
    model.config.use_cache = False
    pad = model.config.pad_token_id
    if pad is None:
        eos = model.config.eos_token_id
        pad = (eos[0] if isinstance(eos, list) else eos) or 0
    if cfg.learner.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return model, int(pad)


class PolicyModel:
    """What ``build`` made: ``engine`` (DeepSpeed), ``reference``, ``device``, ``pad_id``,
    ``gas`` (micro-batches per optimizer step) and ``version`` (optimizer steps applied)."""

    def __init__(self, cfg: Config, engine, reference: Reference, device: torch.device, pad_id: int, gas: int,
                 rank: int, world_size: int):
        self.cfg, self.engine, self.reference, self.device = cfg, engine, reference, device
        self.pad_id, self.gas, self.rank, self.world_size = pad_id, gas, rank, world_size
        self.version = 0
        self.timing: dict[str, float] = {}

    # ------------------------------------------------------------------ construction
    @classmethod
    def build(cls, cfg: Config, rank: int, world_size: int, master_addr: str, master_port: int,
              local_rank: Optional[int]) -> "PolicyModel":
        """Join the process group (``RANK`` ... ``MASTER_PORT`` set here), load the model, wrap it
        in LoRA (``lora.enabled``), make the reference and the DeepSpeed engine."""
        device, t_dist = join_group(cfg, rank, world_size, master_addr, master_port, local_rank)
        t0 = time.perf_counter()
        model, pad = load_base(cfg)
        built = cls.wrap(cfg, model, device, pad, rank, world_size)
        built.timing = {"timing/init_distributed": t_dist, "timing/model": time.perf_counter() - t0}
        return built

    @classmethod
    def wrap(cls, cfg: Config, model: torch.nn.Module, device: torch.device, pad: int, rank: int,
             world_size: int) -> "PolicyModel":
        """The policy over ``model`` (a base from :func:`load_base`, or a structure sharing its
        weights: ``learner/adapters.py``): LoRA (``lora.enabled``, its initial weights drawn from
        ``trainer.seed``), the reference and the DeepSpeed engine."""
        import deepspeed

        cuda = learner_on_gpu(cfg)
        if cfg.lora.enabled:
            from peft import LoraConfig, get_peft_model

            lcfg = LoraConfig(r=cfg.lora.r, lora_alpha=cfg.lora.alpha, lora_dropout=cfg.lora.dropout,
                              target_modules=list(cfg.lora.target_modules), task_type="CAUSAL_LM")
            torch.manual_seed(cfg.trainer.seed)  # A's initial draw: the same for an adapter alone or beside others
            model = get_peft_model(model, lcfg)
            dtype = getattr(torch, trainable_dtype(cfg))
            for q in model.parameters():  # lora.dtype float32: PEFT's upcast, made explicit (and undone for model)
                if q.requires_grad:
                    q.data = q.data.to(dtype)
        needs_copy = cfg.algo.beta > 0 and cfg.algo.kl_reference == "ref"
        reference = Reference(model, lora=cfg.lora.enabled, needs_copy=needs_copy, device=device)
        params = [p for p in model.parameters() if p.requires_grad]
        engine, _, _, _ = deepspeed.initialize(
            model=model, model_parameters=params, config=deepspeed_config(cfg, world_size),
            lr_scheduler=make_scheduler_factory(cfg))
        engine.train()
        return cls(cfg, engine, reference, engine.device if cuda else device,
                   int(pad),  # any id works: padded positions are masked out
                   gradient_accumulation_steps(cfg, world_size), rank, world_size)

    # ------------------------------------------------------------------ what it holds
    @property
    def module(self) -> torch.nn.Module:
        return self.engine.module

    def trainable(self) -> list[torch.nn.Parameter]:
        return [p for p in self.module.parameters() if p.requires_grad]

    def needs_ref(self) -> bool:
        """Whether the loss has a KL term against the reference (a reference pass runs)."""
        return self.cfg.algo.beta > 0 and self.cfg.algo.kl_reference == "ref"

    def gathered(self, params: list[torch.nn.Parameter]):
        """A context in which ZeRO-3 partitioned ``params`` are whole (a no-op below stage 3)."""
        if self.cfg.learner.zero_stage == 3:
            import deepspeed

            return deepspeed.zero.GatheredParameters(params, modifier_rank=None)
        return contextlib.nullcontext()

    def sizes(self) -> dict[str, int]:
        params = list(self.module.parameters())
        trainable = [p for p in params if p.requires_grad]
        return {"trainable_params": sum(numel(p) for p in trainable), "total_params": sum(numel(p) for p in params),
                "adapter_bytes": sum(numel(p) * p.element_size() for p in trainable)}

    # ------------------------------------------------------------------ forward passes
    def forward(self, mb: Collated, module=None, entropy: bool = False):
        """Log-probs ``[B, C]`` (temperature-scaled, fp32) of the completion tokens; optional
        entropies ``[B, C]`` (no grad). ``module``: the engine (default) or a bare module."""
        module = module if module is not None else self.engine
        temperature = self.cfg.rollout.temperature
        if mb.packed:
            groups = {} if mb.groups is None else {group_attention.KWARG: mb.groups}
            kept = {} if mb.kept_pos is None else {"logits_to_keep": mb.kept_pos}  # completion tokens' only
            logits = module(input_ids=mb.input_ids, attention_mask=mb.attention_mask, position_ids=mb.position_ids,
                            use_cache=False, **groups, **kept).logits
            values = packed_token_values if mb.kept_pos is None else kept_token_values
            return values(logits / temperature if temperature != 1.0 else logits, mb, entropy)
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
    def eval_mode(self):
        """The module in eval mode (no dropout) inside the context, as it was after it."""
        module = self.module
        was = module.training
        module.eval()
        try:
            yield
        finally:
            module.train(was)

    @torch.no_grad()
    def logprobs_nograd(self, mb: Collated, reference: bool = False, entropy: bool = False):
        """``forward`` in eval mode without grad, of the policy or (``reference``) the KL
        reference; log-probs ``[B, C]``, or ``(log-probs, entropies)`` with ``entropy``."""
        with self.eval_mode():
            if not reference:
                out = self.forward(mb, self.module, entropy)
            else:
                with self.reference.active(self.module) as ref:
                    out = self.forward(mb, ref, entropy)
        return out if entropy else out[0]
