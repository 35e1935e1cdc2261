"""What one learner step reads back to the host, and the passes it runs (CPU, one process).

A read of a tensor's value into Python (``item``, ``float()``, ``tolist``, ...) waits for the
device to finish all the work queued before it: on a GPU, one per micro-batch stalls the
pipeline that many times. The learner keeps every metric a 0-d tensor until the end of its
step and reads them in one go, so the reads its own code makes are a small constant per step
whatever the number of micro-batches. Counted at the tensor's methods, for the calls made from
``grpo_dist``'s own code (torch's Adam reads its CPU step counters with ``item``: no device sync,
and not ours).
"""

from __future__ import annotations

import contextlib
import math
import os
import sys
from collections import Counter
from typing import Iterator

import pytest
import torch

import grpo_dist
from grpo_dist.testing.learner import make_learner, random_batch, randomize_lora, small_config

pytestmark = pytest.mark.usefixtures("in_process_learners")

READS = ("item", "tolist", "__float__", "__int__", "__bool__", "__index__", "numpy", "cpu")
PACKAGE = os.path.dirname(grpo_dist.__file__) + os.sep


@contextlib.contextmanager
def host_reads() -> Iterator[Counter]:
    """Count the tensor reads whose caller is in grpo_dist, by ``file:line``."""
    seen: Counter = Counter()
    originals = {name: getattr(torch.Tensor, name) for name in READS}

    def counting(name):
        original = originals[name]

        def read(self, *args, **kwargs):
            caller = sys._getframe(1).f_code
            if caller.co_filename.startswith(PACKAGE):
                seen[f"{caller.co_filename[len(PACKAGE):]}:{sys._getframe(1).f_lineno} {name}"] += 1
            return original(self, *args, **kwargs)
        return read

    for name in READS:
        setattr(torch.Tensor, name, counting(name))
    try:
        yield seen
    finally:
        for name, original in originals.items():
            setattr(torch.Tensor, name, original)


VARIANTS = {
    "clip": dict(algo={"beta": 0.04}),
    "clip-padded-2-iterations": dict(algo={"beta": 0.04, "num_iterations": 2}, learner={"packing": "off"}),
    "weighted-nll-rollout-is": dict(algo={"beta": 0.04, "loss": "weighted_nll", "rollout_is": "truncate"}),
}


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_one_read_of_the_metrics_per_step_whatever_the_micro_batches(tiny_model_dir, variant):
    """8 micro-batches of one completion: the learner's own reads are the token counts (once,
    before the first forward), the metrics (once, at the end), the gradient norm (once per
    optimizer step) and the parameter norm: fewer than one per micro-batch."""
    kw = VARIANTS[variant]
    cfg = small_config(tiny_model_dir, algo=kw["algo"], learner={"micro_batch_size": 1, **kw.get("learner", {})})
    learner, _ = make_learner(cfg)
    try:
        randomize_lora(learner)
        batch = random_batch(8, seed=3)
        batch.behaviour_logprobs = [[-1.0] * len(c) for c in batch.completion_ids]
        learner.train_step(batch)  # the first step's one-off work is not the point
        with host_reads() as seen:
            m = learner.train_step(batch)
        iterations = cfg.algo.num_iterations
        print(f"{variant}: {sum(seen.values())} reads in grpo_dist over {learner.policy.gas} micro-batches x "
              f"{iterations} iterations: {dict(seen)}")
        assert learner.policy.gas == 8
        assert sum(seen.values()) <= 3 + iterations, dict(seen)
        assert all(isinstance(v, float) for v in m.values()) and math.isfinite(m["train/loss"])
        assert "train/kl" in m and "train/logprob_diff_behaviour_max" in m
    finally:
        learner.shutdown()


@pytest.mark.parametrize("beta,kl_reference,passes_per_micro_batch", [(0.0, "ref", 1), (0.04, "old", 1),
                                                                      (0.04, "ref", 2)])
def test_reference_pass_only_when_the_loss_has_a_kl_term_against_it(tiny_model_dir, beta, kl_reference,
                                                                     passes_per_micro_batch):
    """algo.beta 0 (or a KL against the old policy): no forward pass of the reference; beta > 0
    against the reference: one per micro-batch, before the update."""
    cfg = small_config(tiny_model_dir, algo={"beta": beta, "kl_reference": kl_reference})
    learner, _ = make_learner(cfg)
    forwards = []
    hook = learner.engine.module.register_forward_pre_hook(lambda module, args: forwards.append(1))
    try:
        m = learner.train_step(random_batch(8, seed=4))
        assert learner.policy.gas == 4
        assert len(forwards) == passes_per_micro_batch * learner.policy.gas
        assert ("train/kl" in m) == (beta > 0)
    finally:
        hook.remove()
        learner.shutdown()


def test_metric_weights_may_be_tensors_read_with_the_values():
    """A weight that is a tensor (a token count not read yet) is read with the values: a mean
    weighs by it, a max of weight 0 is left out, and a name whose weights are all 0 is absent."""
    from grpo_dist.learner.state import MetricAccumulator

    acc = MetricAccumulator()
    acc.add({"gap_max": torch.tensor(5.0)}, torch.tensor(0))
    acc.add_weighted("gap_mean", torch.tensor(0.0), torch.tensor(0))
    acc.add({"gap_max": torch.tensor(2.0)}, torch.tensor(3))
    acc.add_weighted("gap_mean", torch.tensor(1.0), torch.tensor(3))
    acc.add_weighted("gap_mean", 4.0, 1.0)
    acc.add({"none_max": torch.tensor(7.0), "none_min": torch.tensor(7.0)}, torch.tensor(0))
    acc.add_weighted("none_mean", torch.tensor(7.0), torch.tensor(0.0))
    with host_reads() as seen:
        out = acc.reduce(world_size=1)
    assert out == {"train/gap_max": 2.0, "train/gap_mean": 7.0 / 4}
    assert sum(seen.values()) == 1  # every value and weight in one read
