"""In-flight loads on vLLM's async engine (issue 44 items 1-3; tiny model, one engine, no Ray).

A full-weight version is loaded while a group generates: the requests are kept, not drained, and
each sample's tokens carry the version that sampled them. With ``inflight_kv: recompute`` every
token sampled after the load carries the log-prob the new version assigns over its recomputed
context (vLLM's prompt log-probs of prompt + completion under the new weights); with ``keep`` the
old keys and values stay, and those log-probs differ (the kept-KV bias the docs describe)."""

from __future__ import annotations

import asyncio
import shutil

import pytest
import torch

from grpo_dist.rollout.base import SamplingSpec

pytestmark = pytest.mark.slow

SPEC = SamplingSpec(n=1, temperature=1.0, max_tokens=200)
PROMPT = [1, 5, 6, 7, 8]


def perturbed(src, dst, seed: int):
    """A copy of the model at ``src`` with seeded noise on every weight: another version."""
    import safetensors.torch as st

    shutil.copytree(src, dst)
    f = next(dst.glob("*.safetensors"))
    g = torch.Generator().manual_seed(seed)
    sd = {k: v + 0.05 * torch.randn(v.shape, generator=g, dtype=v.dtype) for k, v in st.load_file(f).items()}
    st.save_file(sd, f, metadata={"format": "pt"})
    return dst


async def tokens_so_far(engine) -> int:
    """Tokens the engine's running requests have produced (test-only look at vLLM's state)."""
    states = engine.llm.output_processor.request_states.values()
    return min((s.detokenizer.num_output_tokens() for s in states), default=0)


async def load_mid_generation(engine, path, version: int, seeds):
    group = asyncio.create_task(engine.generate_group(PROMPT, SPEC, seeds))
    for _ in range(600):  # until every request has sampled a few tokens
        await asyncio.sleep(0.01)
        if engine.busy() and await tokens_so_far(engine) >= 8:
            break
    await engine.load_full_weights(str(path), version)
    samples, started = await group
    return samples, started


async def new_version_logprobs(engine, sample) -> list[float]:
    """The log-prob the engine's weights now assign each sampled token over its whole context."""
    from vllm import SamplingParams, TokensPrompt

    ids = PROMPT + sample.token_ids
    params = SamplingParams(temperature=1.0, max_tokens=1, prompt_logprobs=0, logprobs=0)
    async for out in engine.llm.generate(TokensPrompt(prompt_token_ids=ids), params, f"ref{id(sample)}"):
        final = out
    return [final.prompt_logprobs[len(PROMPT) + j][t].logprob for j, t in enumerate(sample.token_ids)]


def test_inflight_load_keeps_requests_and_versions_each_token(tiny_model_dir, tmp_path):
    from grpo_dist.rollout.async_vllm import AsyncVLLMGenerator

    v1 = perturbed(tiny_model_dir, tmp_path / "v1", seed=1)
    v2 = perturbed(tiny_model_dir, tmp_path / "v2", seed=2)
    engine = AsyncVLLMGenerator(str(tiny_model_dir), enable_lora=False, inflight="recompute",
                                max_model_len=256, cpu_kvcache_gb=0.25)

    async def main():
        await engine.generate_group(PROMPT, SamplingSpec(n=1, max_tokens=4), [0])  # warm
        samples, started = await load_mid_generation(engine, v1, 1, [11, 12])
        assert started == 0 and engine.version == 1
        load = engine.loads[-1]
        assert load["version"] == 1 and load["kept"] == 1 and load["resumed_at"] >= load["paused_at"]
        for s in samples:
            assert s.versions is not None and len(s.versions) == len(s.token_ids)
            cut = s.versions.index(1)  # versions: 0 ... 0 1 ... 1, both present
            assert 0 < cut and set(s.versions[:cut]) == {0} and set(s.versions[cut:]) == {1}
            ref = await new_version_logprobs(engine, s)
            after = [abs(a - b) for a, b in zip(s.logprobs[cut:], ref[cut:])]
            assert max(after) < 1e-4  # recomputed context: the new version's log-probs exactly
            assert max(abs(a - b) for a, b in zip(s.logprobs[:cut], ref[:cut])) > 1e-2  # the old version's

        engine.inflight = "keep"  # the same engine, the KV cache of the running requests kept
        samples, started = await load_mid_generation(engine, v2, 2, [13])
        s = samples[0]
        cut = s.versions.index(2)
        assert started == 1 and 0 < cut
        ref = await new_version_logprobs(engine, s)
        assert max(abs(a - b) for a, b in zip(s.logprobs[cut:], ref[cut:])) > 1e-3  # attends to v1's keys

    try:
        asyncio.run(main())
    finally:
        engine.close()
