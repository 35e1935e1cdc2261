"""StreamingRolloutWorker: a RolloutWorker whose engine is vLLM's async engine (``rollout.streaming``).

Wrapped as an *async* Ray actor (``grpo_dist.cluster.actors``): its calls run concurrently, one
:meth:`generate_group` per prompt group, weight loads among them. Tokenisation, merging and
the adapter store are RolloutWorker's; the engine is :class:`AsyncVLLMGenerator`. Ray runs an
async actor's calls out of order, so a group names the oldest version it may run with
(``min_version``) and a load older than the version already held is skipped.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from grpo_dist.rollout.seeds import SeedKey
from grpo_dist.rollout.turns_async import run_group_async
from grpo_dist.rollout.weight_group import StreamingWeightGroupMember
from grpo_dist.rollout.worker import RolloutWorker, generator_kwargs
from grpo_dist.types import AdapterUpdate, RolloutGroup


def resident_versions(cfg) -> int:
    """LoRA versions an engine may serve at once: groups up to ``trainer.max_staleness`` versions
    old still running, the newest, and one being loaded. They all stay loaded in the engine and
    their directories in the store (vLLM reads an evicted adapter again from its directory)."""
    return max(cfg.rollout.max_loras, cfg.sync.keep_versions, int(cfg.trainer.max_staleness) + 2)


class StreamingRolloutWorker(StreamingWeightGroupMember, RolloutWorker):
    _lock: asyncio.Lock | None = None

    def _make_engine(self, seed: int):
        """vLLM's async engine; the LoRA versions in use at once stay loaded."""
        if self.cfg.rollout.backend != "vllm":
            raise ValueError("rollout.streaming needs rollout.backend: vllm")
        from grpo_dist.rollout.async_vllm import AsyncVLLMGenerator

        kw = generator_kwargs(self.cfg, seed)
        r = self.cfg.rollout
        return AsyncVLLMGenerator(kw.pop("model_path"), max_cpu_loras=resident_versions(self.cfg),
                                  inflight=r.inflight_kv if r.inflight_updates else None, **kw)

    def setup(self, *args, **kwargs) -> dict[str, Any]:
        info = super().setup(*args, **kwargs)
        if getattr(self.engine, "enable_lora", False):  # versions coexist (merged/full: one at a time, drained)
            self.store.keep = resident_versions(self.cfg)
        return info

    def _loads(self) -> asyncio.Lock:
        if self._lock is None:
            self._lock = asyncio.Lock()
        return self._lock

    async def generate_group(self, record: Any, key: SeedKey | None, min_version: int = 0) -> tuple[RolloutGroup, float]:
        """One prompt's group, with the wall time it finished (``time.time()``)."""
        assert self.engine is not None, "call setup() first"
        spec, seeds, ids = self._prepare([record], None, None, None, None if key is None else [key])
        if self.agent is not None:  # an OpenAI-API agent: each of its requests one engine request
            return await self._agent_group(record, ids[0], spec, None if seeds is None else seeds[0],
                                           min_version), time.time()
        if self.envs is not None:  # multi-turn: each trajectory its own coroutine (rollout/turns_async.py)
            return await run_group_async(self.engine, record, ids[0], spec, None if seeds is None else seeds[0],
                                         self.envs, self.cfg.model.max_model_len, min_version), time.time()
        samples, version = await self.engine.generate_group(ids[0], spec, None if seeds is None else seeds[0], min_version)
        return self._group(record, ids[0], samples, version), time.time()

    async def generate(self, prompts: list[Any], n: int | None = None, temperature: float | None = None,
                       seed: int | None = None, keys: list[SeedKey] | None = None) -> list[RolloutGroup]:
        """RolloutWorker.generate's contract (evaluation, refills): the groups run concurrently."""
        assert self.engine is not None, "call setup() first"
        spec, seeds, ids = self._prepare(prompts, n, temperature, seed, keys)
        if self.agent is not None:
            return list(await asyncio.gather(*[self._agent_group(rec, pids, spec, None if seeds is None else seeds[i])
                                               for i, (rec, pids) in enumerate(zip(prompts, ids))]))
        if self.envs is not None:
            return list(await asyncio.gather(*[run_group_async(
                self.engine, rec, pids, spec, None if seeds is None else seeds[i], self.envs,
                self.cfg.model.max_model_len) for i, (rec, pids) in enumerate(zip(prompts, ids))]))
        outs = await asyncio.gather(*[self.engine.generate_group(pids, spec, None if seeds is None else seeds[i])
                                      for i, pids in enumerate(ids)])
        return [self._group(rec, pids, samples, version) for rec, pids, (samples, version) in zip(prompts, ids, outs)]

    async def _agent_group(self, record: Any, prompt_ids: list[int], spec, seeds: list[int] | None,
                           min_version: int = 0) -> RolloutGroup:
        """``rollout.agent``'s trajectories of one record: the endpoint and the agents run on the
        environments' loop (rollout/agent.py, as in the batch pipeline); each request they make is
        one request of the async engine, on this actor's loop, at ``min_version`` or newer."""
        from grpo_dist.envs.base import env_loop

        loop, engine = asyncio.get_running_loop(), self.engine

        async def call(ids: list[int], one, seed: int | None):  # on the environments' loop
            fut = asyncio.run_coroutine_threadsafe(
                engine.generate_group(ids, one, None if seed is None else [seed], min_version), loop)
            samples, version = await asyncio.wrap_future(fut)
            return samples[0], version

        group = self.agent.stream_group(call, engine.tokenizer, record, prompt_ids, spec, seeds,
                                        self.cfg.model.max_model_len, self.version)
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(group, env_loop()))

    async def load_update(self, payload: object) -> dict[str, float]:
        """The engine half of a payload transport: receive version v+1 and serve it (:meth:`load_weights`)."""
        return await self.load_weights(self.transport.receive(payload))

    async def load_weights(self, update: AdapterUpdate) -> dict[str, float]:
        """Serve ``update`` to the groups started from now on (in-flight ones finish with theirs)."""
        t0 = time.perf_counter()
        async with self._loads():
            current = self.version
            if update.version <= current and current > 0:  # a newer load overtook this one
                return {"version": current, "bytes": update.nbytes, "seconds": 0.0, "skipped": 1.0}
            update, path, nbytes, clocks = await asyncio.to_thread(self._store_update, update)
            t1 = time.perf_counter()
            await self._serve(update.version, str(path), update.is_lora)
        t2 = time.perf_counter()
        return {"version": update.version, "bytes": nbytes, "seconds": t2 - t0, **clocks, "load_s": t2 - t1}

    async def _serve(self, version: int, path: str | None, is_lora: bool) -> None:
        if is_lora:
            await self.engine.set_adapter(version, path)
        else:
            await self.engine.load_full_weights(path, version)
        self.version = version

    async def load_adapter_dir(self, path: str | None, version: int) -> dict[str, Any]:
        """Serve a PEFT adapter directory from disk as ``version`` (None: the base model)."""
        async with self._loads():
            if self.merger is None:
                await self._serve(version, path, True)
            else:
                from grpo_dist.sync.merge import read_adapter_dir

                tensors, peft_config = read_adapter_dir(path) if path is not None else (None, None)
                merged = AdapterUpdate(version, self.merger.merged(tensors, peft_config, partial=True), None)
                await self._serve(version, str(self.store.write(merged)), False)
        return {"version": version}

    def inflight_loads(self) -> list[dict]:
        """The in-flight loads since the last call (version, requests kept, when paused and resumed),
        handed to the driver once."""
        loads = getattr(self.engine, "loads", None) or []
        out, loads[:] = list(loads), []
        return out

    def sleep(self) -> bool:
        return False
