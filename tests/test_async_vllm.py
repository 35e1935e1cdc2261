"""AsyncVLLMGenerator's version logic on a fake AsyncLLM (fast, no vLLM engine, no Ray).

LoRA versions coexist (a running group keeps its adapter; an old one is removed once no group
uses it); a full-weight load drains (new groups wait, running ones finish first); a group never
starts below its ``min_version``; one request per sample with its own seed.
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from grpo_dist.rollout.async_vllm import AsyncVLLMGenerator
from grpo_dist.rollout.base import SamplingSpec


class FakeLLM:
    """Records calls; a request finishes when its gate opens (all open unless ``hold``)."""

    def __init__(self):
        self.log: list[tuple] = []
        self.hold: asyncio.Event | None = None

    async def generate(self, prompt, params, request_id, lora_request=None):
        self.log.append(("start", params.seed, getattr(lora_request, "lora_int_id", None)))
        if self.hold is not None:
            await self.hold.wait()
        tok = (params.seed or 0) % 50
        out = SimpleNamespace(token_ids=[tok], text=str(tok), finish_reason="length",
                              logprobs=[{tok: SimpleNamespace(logprob=-0.5)}])
        self.log.append(("end", params.seed))
        yield SimpleNamespace(outputs=[out] * params.n)

    async def add_lora(self, req):
        self.log.append(("add_lora", req.lora_int_id))

    async def remove_lora(self, lora_id):
        self.log.append(("remove_lora", lora_id))

    async def collective_rpc(self, method, kwargs=None):
        self.log.append((method, kwargs["weights_path"]))

    async def reset_prefix_cache(self):
        pass


def fake(enable_lora: bool) -> AsyncVLLMGenerator:
    g = AsyncVLLMGenerator.__new__(AsyncVLLMGenerator)
    g.llm, g.enable_lora, g.version, g.tokenizer = FakeLLM(), enable_lora, 0, None
    g._lora, g._draining, g._cond, g._load_lock = {}, False, None, None
    from collections import Counter
    from itertools import count

    g._inflight, g._ids = Counter(), count()
    return g


SPEC = SamplingSpec(n=3, temperature=1.0, max_tokens=1)


def test_one_request_per_sample_with_its_seed():
    async def main():
        g = fake(True)
        samples, version = await g.generate_group([1, 2], SPEC, [7, 8, 9])
        assert version == 0 and [s.token_ids for s in samples] == [[7], [8], [9]]
        assert samples[0].logprobs == [-0.5] and samples[0].finish_reason == "length"
        assert [e[1] for e in g.llm.log if e[0] == "start"] == [7, 8, 9]
        samples, _ = await g.generate_group([1], SPEC, None)  # unseeded: one request of n
        assert len(samples) == 3
    asyncio.run(main())


def test_lora_versions_coexist_and_old_ones_go_when_unused():
    async def run_all():
        g = fake(True)
        await g.set_adapter(1, "/v1")
        gate = asyncio.Event()
        g.llm.hold = gate
        old = asyncio.create_task(g.generate_group([1], SPEC, [1, 2, 3]))
        await asyncio.sleep(0.01)
        await g.set_adapter(2, "/v2")
        assert ("remove_lora", 1) not in g.llm.log and g._inflight[1] == 1
        g.llm.hold = None
        samples, v_new = await g.generate_group([1], SPEC, [4, 5, 6])
        assert v_new == 2 and not old.done()
        starts = [e for e in g.llm.log if e[0] == "start"]
        assert [e[2] for e in starts] == [1, 1, 1, 2, 2, 2]  # each request tagged with its version's adapter
        gate.set()
        _, v_old = await old
        assert v_old == 1 and g.llm.log[-1] == ("remove_lora", 1) and set(g._lora) == {2}
    asyncio.run(run_all())


def test_full_weight_load_drains_and_min_version_waits():
    async def main():
        g = fake(False)
        gate = asyncio.Event()
        g.llm.hold = gate
        running = asyncio.create_task(g.generate_group([1], SPEC, [1, 2, 3]))
        await asyncio.sleep(0.01)
        load = asyncio.create_task(g.load_full_weights("/w1", 1))
        await asyncio.sleep(0.01)
        later = asyncio.create_task(g.generate_group([1], SPEC, [4, 5, 6]))  # arrives while draining
        waiting = asyncio.create_task(g.generate_group([1], SPEC, [7, 8, 9], min_version=2))
        await asyncio.sleep(0.01)
        assert not load.done() and ("reload_weights", "/w1") not in g.llm.log  # waits for the running group
        assert [e[1] for e in g.llm.log if e[0] == "start"] == [1, 2, 3]  # nothing new started
        g.llm.hold = None
        gate.set()
        assert (await running)[1] == 0
        await load
        assert (await later)[1] == 1
        i_reload = g.llm.log.index(("reload_weights", "/w1"))
        assert all(g.llm.log.index(("end", s)) < i_reload for s in (1, 2, 3))
        assert all(g.llm.log.index(("start", s, None)) > i_reload for s in (4, 5, 6))
        assert not waiting.done()  # min_version 2: not before version 2 is served
        await g.load_full_weights("/w2", 2)
        assert (await waiting)[1] == 2
    asyncio.run(main())


def test_set_adapter_on_an_engine_without_lora_fails():
    with pytest.raises(RuntimeError, match="without LoRA"):
        asyncio.run(fake(False).set_adapter(1, "/v1"))


def test_lora_versions_in_use_stay_loaded_in_the_engine_and_the_store():
    """vLLM reads an adapter evicted from its host cache again from its directory: an engine
    serving versions side by side keeps k + 2 of them loaded, and the store their directories."""
    from grpo_dist.config import load_config
    from grpo_dist.rollout.stream_worker import resident_versions
    from grpo_dist.rollout.vllm_engine import engine_kwargs

    cfg = load_config(None, {"rollout": {"streaming": True}, "trainer": {"max_staleness": 2}})
    assert resident_versions(cfg) == 4
    kw = engine_kwargs("m", enable_lora=True, max_loras=1, max_cpu_loras=resident_versions(cfg))
    assert (kw["max_loras"], kw["max_cpu_loras"]) == (1, 4)
    assert engine_kwargs("m", enable_lora=True, max_loras=1)["max_cpu_loras"] == 1  # the batch engine: as before
