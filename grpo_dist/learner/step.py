"""The training step of one learner rank: micro-batches, the passes before the update (reference,
``pi_old``), the loss, backward and optimizer steps, and the ``train/*`` / ``perf/*`` metrics.

Loss normalisation: every micro-batch's loss is aggregated with the *global* counts (completion
tokens / sequences summed over all micro-batches and ranks), so the sum over micro-batches and
ranks is exactly the single-process whole-batch loss. DeepSpeed averages gradients over ranks,
so ``engine.backward(loss * world_size, scale_wrt_gas=False)`` makes the final gradient the
gradient of that whole-batch loss (no division by the accumulation steps either).

Host syncs: every metric (the loss's and the importance weights', asked of ``grpo_dist.algo`` as
tensors, and the learner's own: entropy, behaviour log-prob gaps) stays a 0-d tensor until the end
of the step and is read in one go (``MetricAccumulator``); the token counts of the loss's
normalisation are read once per step, before the first training forward; the gradient norm once per
optimizer step, the parameter norm once. None per micro-batch (tests/test_learner_syncs.py).
"""

from __future__ import annotations

import time
from typing import Iterator, Optional

import torch

from grpo_dist.algo import masked_mean, quantile, rollout_is_weights
from grpo_dist.config import Config
from grpo_dist.types import TrainBatch

from . import perf
from .batching import Collated, idle_batch, micro_batch_rows, split_micro_batches, token_micro_batches
from .layout import Layout
from .loss import compute_loss
from .model import PolicyModel
from .state import MetricAccumulator, all_reduce_floats, global_norm


def old_logp_source(cfg: Config) -> str:
    """Source of old_logp (pi_old), the ratio's denominator. "policy": the learner's own log-probs
    under the current weights before the update (the proximal policy): logp.detach() when
    num_iterations == 1 (ratio 1), else recomputed once, no grad, before the first update.
    "behaviour": the rollout engine's log-probs (batch.behaviour_logprobs), so the clipped ratio
    itself is the importance-sampling correction of stale (async) rollouts. With
    algo.rollout_is != none pi_old is always "policy" and the mismatch pi_old / pi_behaviour is
    corrected by separate, bounded weights on the policy loss (decoupled PPO; see
    grpo_dist.algo.rollout_is)."""
    return "behaviour" if cfg.trainer.async_rollouts and cfg.algo.rollout_is == "none" else "policy"


class MicroBatches:
    """A step's micro-batches (``rows``: ranges of ``batch``; an empty one is an idle micro-batch),
    handed out one at a time, so the step never holds every micro-batch's tensors (the mask
    layout's 4-D masks and the group layout's blocks grow with its segments;
    tests/test_learner_memory.py). On a CPU learner each pass collates again (a few ms against
    seconds of model); on an accelerator each is collated once into host memory and copied over per
    pass (collating would cost as much as a small model's pass there)."""

    def __init__(self, layout: Layout, batch: TrainBatch, rows: list[range], pad_id: int):
        self.layout, self.batch, self.rows, self.pad_id = layout, batch, rows, pad_id
        self.host: Optional[list] = None if layout.device.type == "cpu" else [None] * len(rows)

    def __len__(self) -> int:
        return len(self.rows)

    def __iter__(self) -> Iterator[Collated]:
        return (self[i] for i in range(len(self)))

    def __getitem__(self, i: int) -> Collated:
        r = self.rows[i]
        batch, r = (self.batch, r) if len(r) else (idle_batch(self.batch, self.pad_id), None)
        if self.host is None:
            return self.layout.collate(batch, r)
        if self.host[i] is None:
            self.host[i] = self.layout.collate(batch, r, device=torch.device("cpu"))
        return self.host[i].to(self.layout.device)


class TrainStep:
    """``algo.num_iterations`` optimizer steps on this rank's shard of a batch (``run``)."""

    def __init__(self, policy: PolicyModel, layout: Layout, peak_flops: float = 0.0,
                 old_source: Optional[str] = None):
        self.policy, self.layout, self.cfg = policy, layout, policy.cfg
        self.peak_flops = peak_flops  # perf/mfu's denominator (FLOP/s); 0 leaves perf/mfu out
        self.params = perf.non_embedding_params(policy.module)
        self.old_logp_source = old_source or old_logp_source(self.cfg)

    def _sum_over_ranks(self, values: list[float]) -> list[float]:
        return values if self.policy.world_size == 1 else all_reduce_floats(values, "sum")

    def run(self, batch: TrainBatch) -> dict[str, float]:
        """Train on ``batch`` (this rank's shard); returns ``train/*``, ``perf/*`` and ``timing/*``."""
        a, p = self.cfg.algo, self.policy
        t0 = time.perf_counter()
        if len(batch.advantages) != len(batch):
            raise ValueError(f"batch has {len(batch)} completions but {len(batch.advantages)} advantages")
        rows = self._micro_rows(batch)
        seqs = [len(r) for r in rows]  # an idle micro-batch (a rank short of rows) weighs nothing
        use_is = a.rollout_is != "none"
        if (self.old_logp_source == "behaviour" or use_is) and not batch.behaviour_logprobs:
            need = ("old_logp_source='behaviour'" if self.old_logp_source == "behaviour"
                    else f"algo.rollout_is={a.rollout_is}")
            raise ValueError(f"{need} needs behaviour_logprobs for every completion")
        # the passes before the update, one micro-batch at a time; what the step keeps of each is
        # [B, C] per completion token: its loss mask, the reference's and pi_old's log-probs
        # (behaviour: pi_old is the batch's; num_iterations 1: logp.detach() per micro-batch, ratio 1)
        entropy, need_ref = a.top_entropy_frac < 1.0, p.needs_ref()
        policy_old = self.old_logp_source == "policy" and a.num_iterations > 1
        micro = MicroBatches(self.layout, batch, rows, p.pad_id)
        masks, ents = [], []
        ref: Optional[list] = [] if need_ref else None
        old: Optional[list] = [] if policy_old or self.old_logp_source == "behaviour" else None
        tokens, t_ref_old = 0, 0.0
        for mb in micro:
            masks.append(mb.mask)
            tokens += mb.tokens
            lp = None
            if entropy:  # the same pass gives pi_old
                lp, e = p.logprobs_nograd(mb, entropy=True)
                ents.append(e)
            ts = time.perf_counter()
            if need_ref:
                ref.append(p.logprobs_nograd(mb, reference=True))
            if policy_old:
                old.append(lp if lp is not None else p.logprobs_nograd(mb))
            elif old is not None:
                old.append(mb.behaviour_logp)
            t_ref_old += time.perf_counter() - ts
        nograd_passes = int(entropy or policy_old) + int(need_ref)
        selected = self._keep_high_entropy(ents, masks, a.top_entropy_frac) if entropy else None
        counts = torch.stack([m.sum() for m in masks]).tolist()  # one read for every micro-batch
        global_tokens, global_seqs = self._sum_over_ranks([float(sum(counts)), float(len(batch))])
        # IS weights: fixed for the step (pi_old does not move between iterations); with old None they
        # are made from the first iteration's logp.detach(), micro-batch by micro-batch
        is_w: list = [None] * len(micro)
        t2 = time.perf_counter()
        t1 = t2 - t_ref_old

        acc = MetricAccumulator()
        grad_norms: list[float] = []
        lr = float(p.engine.get_lr()[0])
        max_len = a.max_len or self.cfg.rollout.sampled_budget  # multi-turn: over all assistant turns
        for it in range(a.num_iterations):
            for i, mb in enumerate(micro):
                mb.mask = masks[i]
                logp, ent = p.forward(mb, entropy=(it == 0))
                old_i = old[i] if old is not None else logp.detach()
                ref_i = ref[i] if ref is not None else (old_i if a.kl_reference == "old" and a.beta > 0 else None)
                if use_is and is_w[i] is None:
                    is_w[i], is_metrics = rollout_is_weights(
                        old_i, mb.behaviour_logp, mb.mask, a.rollout_is, a.rollout_is_level,
                        a.rollout_is_threshold, a.rollout_is_threshold_low, tensor_metrics=True)
                    acc.add(is_metrics, counts[i], seqs[i])
                loss, metrics = compute_loss(a, logp, old_i, ref_i, mb.advantages, mb.mask, max_len=max_len,
                                             global_tokens=global_tokens, global_seqs=global_seqs,
                                             is_weights=is_w[i])
                acc.add(metrics, counts[i], seqs[i])
                if it == 0:
                    self._diagnostics(acc, logp.detach(), ent, mb, counts[i])
                if self.cfg.learner.micro_batch_tokens:  # a count per step of its own: the boundary is ours
                    p.engine.set_gradient_accumulation_boundary(i == len(micro) - 1)
                p.engine.backward(loss * p.world_size, scale_wrt_gas=False)
                if i == len(micro) - 1 and self.cfg.learner.zero_stage == 0:
                    grad_norms.append(global_norm(self._full_grads()))
                p.engine.step()
            p.version += 1
            gn = p.engine.get_global_grad_norm()
            if gn is not None and len(grad_norms) < it + 1:
                grad_norms.append(float(gn))
        t3 = time.perf_counter()

        out = acc.reduce(p.world_size, a.num_iterations)
        if self.cfg.learner.zero_stage < 3:
            # NaN/inf here means the update broke the weights: the driver stops before syncing them
            out["train/param_norm"] = global_norm(p.trainable())
        t_end = time.perf_counter()
        out.update({
            "train/grad_norm": sum(grad_norms) / len(grad_norms) if grad_norms else float("nan"),
            "train/lr": lr, "train/tokens": global_tokens, "train/sequences": global_seqs,
            "train/version": float(p.version), "train/micro_batches": float(len(micro)),
            **({"train/ref_refreshes": float(p.reference.refreshes)} if a.ref_refresh_every else {}),
            **({"train/entropy_selected_frac": selected} if selected is not None else {}),
            **self._perf(float(tokens), a.num_iterations, nograd_passes, t_end - t0),
            "timing/learn_prepare": t1 - t0, "timing/learn_ref_old": t2 - t1,
            "timing/learn_update": t3 - t2, "timing/learn_total": t_end - t0,
        })
        return out

    def _micro_rows(self, batch: TrainBatch) -> list[range]:
        """This rank's micro-batches: ``gas`` near-equal ranges, or by ``learner.micro_batch_tokens``
        (as many on every rank as the rank that needs most: ZeRO-2/3 run collectives per backward).
        Shards are uneven (agent segments, dynamic sampling, a batch no rank count divides): a rank
        with fewer rows than the count runs one row per range, then empty ranges, each an idle
        micro-batch (``batching.idle_batch``: zero loss and gradient, yet it joins the backward's
        collectives). Capping the count at the smallest shard instead would push the rank that needs
        most past its budget, the bound on its memory."""
        budget = self.cfg.learner.micro_batch_tokens
        if not budget:
            return micro_batch_rows(len(batch), self.policy.gas)
        packed, pack_len = self.layout.mode != "off", self.layout.pack_len if self.layout.mode == "mask" else 0
        rows = token_micro_batches(batch, budget, packed, pack_len=pack_len)
        if self.policy.world_size > 1:
            most = int(all_reduce_floats([float(len(rows))], "max")[0])
            rows = split_micro_batches(batch, rows, most, packed, budget, pack_len)
        return rows

    def _perf(self, tokens: float, updates: int, nograd_passes: int, seconds: float) -> dict[str, float]:
        """``perf/learner_tflops`` (this rank's model FLOPs over the step's wall time, as
        ``perf.step_flops`` counts them) and ``perf/mfu`` (over the peak set at set-up)."""
        flops = perf.step_flops(self.params, tokens * updates, tokens * nograd_passes, not self.cfg.lora.enabled)
        rate = flops / max(seconds, 1e-9)
        out = {"perf/learner_tflops": rate / 1e12}
        if self.peak_flops > 0:
            out["perf/mfu"] = rate / self.peak_flops
        return out

    @torch.no_grad()
    def _keep_high_entropy(self, ents: list[torch.Tensor], masks: list[torch.Tensor], frac: float) -> float:
        """Narrow every micro-batch's loss mask (``masks``, in place) to the ``frac``
        highest-entropy completion tokens of the *whole* batch (``ents``: each micro-batch's
        entropies from one no-grad policy pass; with several ranks the threshold is the quantile
        of every rank's entropies, so the selection equals the single-process one); returns the
        fraction of tokens kept."""
        p = self.policy
        pool = torch.cat([e[m.bool()] for e, m in zip(ents, masks)]).float().cpu()
        if p.world_size > 1:
            import torch.distributed as dist

            parts: list = [None] * p.world_size
            dist.all_gather_object(parts, pool)
            pool = torch.cat(parts)
        if pool.numel() == 0:
            return 0.0
        threshold = quantile(pool, 1.0 - frac).to(ents[0].device)
        for i, e in enumerate(ents):
            masks[i] = masks[i] * (e >= threshold).to(masks[i].dtype)
        kept = self._sum_over_ranks([float(torch.stack([m.sum() for m in masks]).sum())])[0]
        return kept / float(pool.numel())

    @staticmethod
    def _diagnostics(acc: MetricAccumulator, logp, ent, mb: Collated, tokens: float) -> None:
        """Entropy and the gap to the behaviour log-probs, as tensors (read at the step's end)."""
        m = mb.mask.bool()
        if ent is not None and tokens > 0:
            acc.add_weighted("entropy", masked_mean(ent, m), tokens)
        if mb.behaviour_logp is not None and any(mb.lengths):
            # the tokens the loss sees: not the environment tokens of a multi-turn trajectory (they
            # have no behaviour log-prob); with algo.top_entropy_frac < 1, the high-entropy ones
            # (their count stays a tensor too: a micro-batch without any weighs 0 when it is read)
            v = mb.valid & (mb.mask > 0)
            nv = v.sum()
            diff = torch.where(v, (logp - mb.behaviour_logp).abs(), torch.zeros((), dtype=logp.dtype))
            acc.add({"logprob_diff_behaviour_max": diff.max()}, nv)
            acc.add_weighted("logprob_diff_behaviour_mean", diff.sum() / nv.clamp(min=1), nv)

    def _full_grads(self) -> list[Optional[torch.Tensor]]:
        """Gradients at the accumulation boundary, before clipping and the optimizer step (for the
        grad-norm metric on ZeRO stage 0, where DeepSpeed does not record the norm)."""
        from deepspeed.utils import safe_get_full_grad

        return [safe_get_full_grad(p) for p in self.policy.trainable()]
