"""vLLM's async engine (``AsyncLLM``) for the streaming pipeline: requests arrive continuously.

:meth:`AsyncVLLMGenerator.generate_group` runs one group (one request per sample, each with its
own seed, as :class:`VLLMGenerator` does, so completions depend only on the seed keys) and may be
awaited many times at once; vLLM batches whatever is in flight. Weight loads are safe with
requests in flight:

* LoRA: each request carries the ``LoRARequest`` of the version it started with; versions
  coexist in the engine and an old adapter is removed once no request uses it.
* merged / full weights: new requests wait, the in-flight ones finish (drain), the weights are
  reloaded in place, then the waiting requests go on with the new version.

``min_version``: a group waits until the engine holds at least that version (Ray runs an async
actor's calls out of order, so the driver cannot rely on call order for versions).

In-flight updates (``inflight``: ``"recompute"`` or ``"keep"``, ``rollout.inflight_updates``): a
merged / full load does not drain. The engine pauses with its requests kept (vLLM 0.32's
``pause_generation(mode="keep")``; ``clear_cache`` for recompute), loads, labels the engine with
the new version (``update_weight_version``) and resumes; each completion's ``weight_versions``
spans, which the engine core stamps on every step's output, become the sample's per-token
``versions``. Each load's timing is kept in :attr:`loads`.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections import Counter

from grpo_dist.rollout.base import Generator, Sample, SamplingSpec
from grpo_dist.rollout.vllm_compat import check_inflight_support
from grpo_dist.rollout.vllm_engine import engine_kwargs, sampling_params, to_sample, token_versions


class AsyncVLLMGenerator:
    tokenize = Generator.tokenize
    loads_in_memory = False  # its engine core runs in a process of its own: versions go through the store

    inflight: str | None = None  # "recompute" / "keep": in-flight loads (rollout.inflight_kv); None: drain
    loads: list[dict] = []  # in-flight loads, oldest first (the worker hands them to the driver)

    def __init__(self, model_path: str, *, enable_lora: bool = True, inflight: str | None = None, **kw):
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        if kw.pop("enable_sleep_mode", False):
            raise ValueError("rollout.streaming does not support sleeping engines (colocated on GPU)")
        if inflight is not None:
            if enable_lora:
                raise ValueError("rollout.inflight_updates needs merged or full weights (rollout.adapter_mode: merged)")
            check_inflight_support(AsyncLLM)
        self.inflight, self.loads = inflight, []
        self.llm = AsyncLLM.from_engine_args(AsyncEngineArgs(**engine_kwargs(model_path, enable_lora=enable_lora, **kw)))
        self.tokenizer = self.llm.get_tokenizer()
        self.enable_lora = enable_lora
        self.version = 0
        self._lora: dict[int, object] = {}  # version -> LoRARequest still in the engine
        self._inflight: Counter = Counter()  # version -> groups running with it
        self._draining = False
        self._ids = itertools.count()
        self._cond: asyncio.Condition | None = None  # made in the actor's event loop
        self._load_lock: asyncio.Lock | None = None

    def _sync(self) -> tuple[asyncio.Condition, asyncio.Lock]:
        if self._cond is None:
            self._cond, self._load_lock = asyncio.Condition(), asyncio.Lock()
        return self._cond, self._load_lock

    def busy(self) -> int:
        """Groups running now."""
        return sum(self._inflight.values())

    async def generate_group(self, prompt_ids: list[int], spec: SamplingSpec, seeds: list[int] | None,
                             min_version: int = 0) -> tuple[list[Sample], int]:
        """``spec.n`` samples of one prompt (``seeds[j]``: sample j's seed; None: one request of n
        with ``spec.seed``) and the version they ran with (>= ``min_version``)."""
        cond, _ = self._sync()
        async with cond:
            await cond.wait_for(lambda: not self._draining and self.version >= min_version)
            version = self.version
            self._inflight[version] += 1
        lora = self._lora.get(version)
        try:
            if seeds is None:
                outs = await self._request(prompt_ids, sampling_params(spec, spec.n, spec.seed), lora)
            else:
                parts = await asyncio.gather(*[self._request(prompt_ids, sampling_params(spec, 1, s), lora)
                                               for s in seeds])
                outs = [o for part in parts for o in part]
        finally:
            async with cond:
                self._inflight[version] -= 1
                cond.notify_all()
            await self._drop_unused_adapters()
        samples = [to_sample(c, self.tokenizer) for c in outs]
        if self.inflight is not None:  # each token's version, from the spans the engine stamped
            for s, c in zip(samples, outs):
                s.versions = token_versions(c, version)
        return samples, version

    async def _request(self, prompt_ids: list[int], params, lora) -> list:
        from vllm import TokensPrompt

        final = None
        async for out in self.llm.generate(TokensPrompt(prompt_token_ids=list(prompt_ids)), params,
                                           f"g{next(self._ids)}", lora_request=lora):
            final = out
        return list(final.outputs)

    async def _drop_unused_adapters(self) -> None:
        for v in [v for v in self._lora if v != self.version and self._inflight[v] == 0]:
            req = self._lora.pop(v, None)
            if req is not None:
                await self.llm.remove_lora(req.lora_int_id)

    async def set_adapter(self, version: int, path: str | None) -> None:
        """Serve LoRA ``path`` as ``version`` to the groups started from now on (None: the base)."""
        from vllm.lora.request import LoRARequest

        cond, lock = self._sync()
        async with lock:
            if path is not None:
                if not self.enable_lora:
                    raise RuntimeError("this engine was started without LoRA (lora.enabled: false)")
                req = LoRARequest(f"v{version}", version, path)
                await self.llm.add_lora(req)
                self._lora[version] = req
            async with cond:
                self.version = version
                cond.notify_all()
            await self._drop_unused_adapters()

    async def load_full_weights(self, path: str, version: int) -> None:
        """Drain (new groups wait, running ones finish), reload in place, serve ``version``."""
        async def load() -> dict:
            await self.llm.collective_rpc("reload_weights", kwargs={"weights_path": path})
            return {"version": version}

        await self.reload_in_place(load)

    async def reload_in_place(self, load) -> dict:
        """Drain (new groups wait, running ones finish), ``await load()`` (it loads the weights in
        place and answers ``{"version": ...}``), reset the prefix cache, serve that version."""
        cond, lock = self._sync()
        if self.inflight is not None:
            return await self._load_inflight(load)
        async with lock:
            async with cond:
                self._draining = True
                try:
                    await cond.wait_for(lambda: self.busy() == 0)
                    out = await load()
                    await self.llm.reset_prefix_cache()
                    self.version = int(out["version"])
                finally:
                    self._draining = False
                    cond.notify_all()
        return out

    async def _load_inflight(self, load) -> dict:
        """Pause with the running requests kept (their KV cache dropped for ``recompute``), ``await
        load()``, label the engine's outputs with the new version, resume. The running requests go
        on under the new weights; new groups do not wait for them."""
        cond, lock = self._sync()
        async with lock:
            t0, kept = time.time(), self.busy()
            await self.llm.pause_generation(mode="keep", clear_cache=self.inflight == "recompute")
            t1 = time.time()
            try:
                out = await load()
                version = int(out["version"])
                await self.llm.update_weight_version(str(version))  # tokens from the next step on carry it
                async with cond:
                    self.version = version
                    cond.notify_all()
            finally:
                await self.llm.resume_generation()
            t2 = time.time()
        self.loads.append({"version": version, "kept": kept, "paused_at": t0, "resumed_at": t2,
                           "pause_s": t1 - t0, "paused_s": t2 - t0})
        return out

    def close(self) -> None:
        try:
            self.llm.shutdown()
        except Exception:  # pragma: no cover - best effort
            pass
