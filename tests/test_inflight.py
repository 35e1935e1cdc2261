"""In-flight updates without an engine (issue 44): the config's checks, per-token versions from
vLLM's weight-version spans, multi-turn trajectories keeping them, and the async engine's load
path on a fake AsyncLLM (pause with requests kept, load, label, resume: no drain)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from grpo_dist.config import load_config
from grpo_dist.rollout.base import Sample, SamplingSpec
from grpo_dist.rollout.vllm_engine import token_versions
from test_async_vllm import FakeLLM, fake


def test_config_needs_streaming_and_merged_weights():
    with pytest.raises(Exception, match="rollout.inflight_updates needs rollout.streaming"):
        load_config(None, {"rollout": {"inflight_updates": True}})
    with pytest.raises(Exception, match="rollout.inflight_updates.*merged or full weights"):
        load_config(None, {"rollout": {"streaming": True, "inflight_updates": True, "adapter_mode": "lora"}})
    cfg = load_config(None, {"rollout": {"streaming": True, "inflight_updates": True}})
    assert cfg.rollout.inflight_kv == "recompute"
    with pytest.raises(Exception, match="inflight_kv"):
        load_config(None, {"rollout": {"streaming": True, "inflight_updates": True, "inflight_kv": "reuse"}})


def span(v, a, b):
    return SimpleNamespace(version=v, start=a, end=b)


def test_token_versions_from_spans():
    c = SimpleNamespace(token_ids=[5] * 6, weight_versions=[span("default", 0, 2), span("3", 2, 5), span("4", 5, 6)])
    assert token_versions(c, 2) == [2, 2, 3, 3, 3, 4]  # "default": the engine's label before any load
    assert token_versions(SimpleNamespace(token_ids=[1, 2], weight_versions=None), 7) == [7, 7]


def test_trajectory_keeps_each_tokens_version():
    from grpo_dist.rollout.trajectory import Trajectory

    t = Trajectory(record=None, prompt_ids=[1], seed=None, env=None, messages=None)
    t.add([4, 5], [-1.0, -1.0])  # a turn before versions were known: none recorded yet
    assert t.token_versions is None
    t.add([6, 7, 8], [-1.0] * 3, versions=[3, 3, 4])
    t.add([9], None)  # environment tokens: the version before them
    assert t.token_versions == [3, 3, 3, 3, 4, 4] and t.mask == [1, 1, 1, 1, 1, 0]
    s = Sample([1, 2], "x", [-0.1, -0.2], "stop", versions=[4, 5])
    t.take(s, 16, SamplingSpec(n=1, max_tokens=16), SimpleNamespace(max_total_tokens=None), SimpleNamespace(
        decode=lambda ids, skip_special_tokens=False: "x", eos_token_id=None, all_special_ids=[]), version=4)
    assert t.token_versions[-2:] == [4, 5] and t.versions[-1] == 4


class PausingLLM(FakeLLM):
    """FakeLLM with vLLM 0.32's pause / resume / weight-version label."""

    async def pause_generation(self, mode, clear_cache):
        self.log.append(("pause", mode, clear_cache))

    async def resume_generation(self):
        self.log.append(("resume",))

    async def update_weight_version(self, v):
        self.log.append(("label", v))


@pytest.mark.parametrize("kv", ["recompute", "keep"])
def test_inflight_load_pauses_without_draining(kv):
    async def main():
        g = fake(False)
        g.llm, g.inflight, g.loads = PausingLLM(), kv, []
        gate = asyncio.Event()
        g.llm.hold = gate
        running = asyncio.create_task(g.generate_group([1], SPEC, [1, 2, 3]))
        await asyncio.sleep(0.01)
        await asyncio.wait_for(g.load_full_weights("/w1", 1), 1.0)  # does not wait for the running group
        assert not running.done() and g.version == 1
        later = asyncio.create_task(g.generate_group([1], SPEC, [4, 5, 6]))  # starts at once
        await asyncio.sleep(0.01)
        names = [e[0] for e in g.llm.log if e[0] != "start"]
        assert names == ["pause", "reload_weights", "label", "resume"]
        assert g.llm.log[3] == ("pause", "keep", kv == "recompute") and ("label", "1") in g.llm.log
        assert sum(e[0] == "start" for e in g.llm.log) == 6
        assert g.loads[0]["version"] == 1 and g.loads[0]["kept"] == 1
        g.llm.hold = None
        gate.set()
        assert (await running)[1] == 0 and (await later)[1] == 1
        assert (await running)[0][0].versions == [0]  # no spans from the fake: the version it started with
    asyncio.run(main())


SPEC = SamplingSpec(n=3, temperature=1.0, max_tokens=1)
