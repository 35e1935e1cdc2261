"""The learner's memory is bounded by its micro-batch, not by its step (issue 52 item 7).

An agent step (smolagents: a new segment per model call, each repeating a long system prompt) can
hold many times the tokens of a plain one; ``learner.micro_batch_tokens`` bounds what one forward /
backward holds, and nothing else may grow with the step's segments: the step collates, runs the
reference / ``pi_old`` / entropy passes and trains one micro-batch at a time, and keeps per
micro-batch only ``[B, C]`` per-completion-token values (mask, log-probs) across the step. Before,
every micro-batch's collated tensors lived for the whole step: the ``mask`` layout's 4-D masks and
the ``group`` layout's block layouts grew with it (10 -> 40 segments: mask 9.7 -> 14.2 MiB, +47%;
group 10.5 -> 11.9 MiB; now both flat to 0.2%).

The peak is counted at torch's allocator (``TensorPeak``: CI's sandbox keeps no per-process
high-water mark), not the resident set, which also holds what glibc keeps of freed memory (NOTES.md).
The tiny model's activations are small, so anything kept per segment shows.
"""

from __future__ import annotations

import random

import pytest
import torch

from grpo_dist.types import TrainBatch

pytestmark = pytest.mark.usefixtures("in_process_learners")


def agent_segments(trajectories: int, seed: int = 0, system: int = 120, completion: int = 16,
                   turns: int = 5) -> TrainBatch:
    """``turns`` segments per trajectory, as an agent framework's requests make them: every
    segment's prompt is the shared system prompt plus the trajectory so far (its earlier
    completions and the tool results after them), so no two rows share a prompt."""
    rng = random.Random(seed)
    system_prompt = [1] + [rng.randrange(4, 60) for _ in range(system - 1)]
    prompts, comps = [], []
    for _ in range(trajectories):
        history: list[int] = []
        for _ in range(turns):
            comp = [rng.randrange(4, 60) for _ in range(completion)]
            prompts.append(system_prompt + history)
            comps.append(comp)
            history = history + comp + [rng.randrange(4, 60) for _ in range(4)]
    return TrainBatch(prompt_ids=prompts, completion_ids=comps,
                      behaviour_logprobs=[[-1.0] * len(c) for c in comps],
                      advantages=[rng.gauss(0.0, 1.0) for _ in prompts])


@pytest.mark.parametrize("packing,algo", [
    ("mask", {"beta": 0.04, "num_iterations": 2}),  # reference and pi_old passes
    ("group", {"beta": 0.04, "num_iterations": 2, "top_entropy_frac": 0.5}),  # and the entropy pass
    ("off", {"beta": 0.0}),
])
def test_step_peak_stays_flat_as_the_step_grows_4x(tiny_model_dir, packing, algo):
    """10 then 40 agent segments at a fixed ``micro_batch_tokens`` (6 then 24 micro-batches): the
    step's peak allocation stays within 20%."""
    from grpo_dist.testing.learner import make_learner, small_config
    from grpo_dist.util.memory import TensorPeak

    cfg = small_config(tiny_model_dir, algo=algo, learner={"micro_batch_tokens": 400, "packing": packing},
                       rollout={"max_tokens": 64})
    learner, info = make_learner(cfg)
    try:
        assert info["packing"] == packing
        learner.train_step(agent_segments(1, seed=9))  # the first step's one-off allocations (Adam's state)
        peaks, micro = {}, {}
        for trajectories in (2, 8):
            with TensorPeak() as peak:
                m = learner.train_step(agent_segments(trajectories))
            assert peak.extra is not None, "the profiler recorded no allocations"
            peaks[trajectories], micro[trajectories] = peak.extra, m["train/micro_batches"]
        print(f"{packing}: peak {peaks[2] / 2**20:.2f} MiB over 10 segments ({micro[2]:.0f} micro-batches), "
              f"{peaks[8] / 2**20:.2f} MiB over 40 ({micro[8]:.0f})")
        assert micro[8] >= 3 * micro[2]  # the step grew, its micro-batches did not
        assert peaks[8] <= 1.2 * peaks[2], (peaks, micro)
    finally:
        learner.shutdown()


def test_group_layout_computes_logits_of_completion_tokens_only(tiny_model_dir):
    """The group layout asks the model for the logits that score a completion token only (a
    prompt's last position once per completion, then each completion's own positions), not the
    whole packed row's: long agent prompts cost no vocabulary-sized logits. Log-probs, entropies
    and gradients stay the padded layout's."""
    from grpo_dist.testing.learner import make_learner, randomize_lora, small_config

    cfg = small_config(tiny_model_dir, algo={"beta": 0.04}, learner={"packing": "group", "micro_batch_size": 10})
    learner, _ = make_learner(cfg)
    try:
        randomize_lora(learner)
        batch = agent_segments(2, turns=5, system=40, completion=6)
        lm_rows: list[int] = []
        head = learner.engine.module.get_output_embeddings()
        hook = head.register_forward_hook(lambda mod, args, out: lm_rows.append(args[0].shape[-2]))
        policy = learner.policy
        try:
            mb = learner.layout.collate(batch)
            logp, ent = policy.forward(mb, policy.module, entropy=True)
            (logp * mb.mask).sum().backward()
            packed_grads = [p.grad.clone() for p in policy.trainable()]
        finally:
            hook.remove()
        completion_tokens = sum(len(c) for c in batch.completion_ids)
        assert lm_rows == [completion_tokens], (lm_rows, mb.input_ids.shape)
        for p in policy.trainable():
            p.grad = None
        padded = learner.layout.collate(batch, mode="off")
        want, want_ent = policy.forward(padded, policy.module, entropy=True)
        (want * padded.mask).sum().backward()
        assert torch.allclose(logp, want, atol=1e-5) and torch.allclose(ent, want_ent, atol=1e-5)
        for g, p in zip(packed_grads, policy.trainable()):
            assert torch.allclose(g, p.grad, atol=1e-5)
    finally:
        learner.shutdown()
