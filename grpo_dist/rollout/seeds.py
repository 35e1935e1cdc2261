"""Per-completion sampling seeds: a pure function of (trainer seed, step, prompt index, sample index).

A completion's random stream then depends on nothing else: not on how many rollout workers
there are, which worker got the prompt, whether that worker was replaced, or whether the run
was resumed. vLLM gets one request per sample with ``SamplingParams(seed=...)`` (its own
``torch.Generator``); the transformers backend seeds one generator per sample.

The trainer's "prompt index" is the prompt's position in the run's prompt stream (epoch * N +
position in the epoch's order), so prompts drawn in the same step (dynamic sampling refills
included) never share seeds; evaluation uses ``(eval seed, 0, record id)``.
"""

from __future__ import annotations

import hashlib
import struct

SeedKey = tuple[int, int, int]  # (seed, step, prompt index)


def sample_seed(seed: int, step: int, prompt: int, sample: int) -> int:
    """A 63-bit seed, stable across processes, Python versions and platforms."""
    digest = hashlib.blake2b(struct.pack("<4q", int(seed), int(step), int(prompt), int(sample)),
                             digest_size=8, person=b"grpo_dist").digest()
    return int.from_bytes(digest, "little") >> 1


def sample_seeds(keys: list[SeedKey], n: int) -> list[list[int]]:
    """``n`` sample seeds for each prompt key."""
    return [[sample_seed(*key, j) for j in range(n)] for key in keys]
