"""RolloutWorker: one inference engine + the adapter version it serves.

A plain class (testable without Ray); ``grpo_dist.run.workers`` makes it a Ray actor. It
tokenises prompts itself, so the ``Rollout`` carries the exact prompt ids the learner must use.

Several adapters (issue 53): the calls that generate or load weights take ``adapter=NAME``. The
worker keeps each adapter's newest update and its version, and loads nothing when one arrives; an
engine that merges adapters into its weights serves one adapter at a time, so a generate call
first reloads its adapter's newest weights merged into the base if the engine holds others. An
adapter's step thus costs one load, as a step of its own run does.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from grpo_dist.config import Config
from grpo_dist.devices import BIND_ENV, adapter_mode, engine_cpus, engine_dtype, sleeps_while_learning, torch_threads
from grpo_dist.rollout.agent import AgentRollouts
from grpo_dist.rollout.base import Generator, SamplingSpec, progress_of
from grpo_dist.envs.registry import EnvSource
from grpo_dist.rollout.seeds import SeedKey, sample_seeds
from grpo_dist.rollout.turns import run_trajectories
from grpo_dist.rollout.user_fn import UserRollouts
from grpo_dist.rollout.weight_group import WeightGroupMember, weight_group_engine_kwargs
from grpo_dist.sync import AdapterStore, make_transport
from grpo_dist.sync.merge import LoraMerger, read_adapter_dir
from grpo_dist.types import AdapterUpdate, Rollout, RolloutGroup
from grpo_dist.util.proc_health import EngineProcessLost, StartWatch, describe, engine_processes, exited_on_its_own

log = logging.getLogger("grpo_dist.rollout")


def generator_kwargs(cfg: Config, seed: int) -> dict[str, Any]:
    """The constructor arguments of a vLLM generator (sync or async) for ``cfg``."""
    return dict(model_path=cfg.model.path, max_model_len=cfg.model.max_model_len,
                enable_lora=adapter_mode(cfg)[0] == "lora", lora_rank=cfg.lora.r, max_loras=cfg.rollout.max_loras,
                enforce_eager=cfg.rollout.enforce_eager, gpu_memory_utilization=cfg.rollout.gpu_memory_utilization,
                cpu_kvcache_gb=cfg.rollout.cpu_kvcache_gb, enable_sleep_mode=sleeps_while_learning(cfg),
                dtype=engine_dtype(cfg)[0], seed=seed, trust_remote_code=cfg.model.trust_remote_code,
                **weight_group_engine_kwargs(cfg, in_memory=adapter_mode(cfg)[0] != "lora"))


def make_generator(cfg: Config, seed: int) -> Generator:
    """The batch engine of ``rollout.backend`` (the streaming worker makes its own, async one)."""
    if cfg.rollout.backend == "vllm":
        from grpo_dist.rollout.vllm_engine import VLLMGenerator

        kw = generator_kwargs(cfg, seed)
        return VLLMGenerator(kw.pop("model_path"), in_process=bool(cfg.rollout.engine_in_process), **kw)
    from grpo_dist.rollout.hf_engine import HFGenerator

    return HFGenerator(cfg.model.path, max_batch_size=cfg.rollout.hf_max_batch_size,
                       dtype=engine_dtype(cfg)[0], seed=seed,
                       trust_remote_code=cfg.model.trust_remote_code)


class RolloutWorker(WeightGroupMember):
    def __init__(self, cfg: Config, rank: int = 0, adapters: dict[str, Config] | None = None):
        """``adapters``: several adapters' configs (their sampling: group size, max tokens,
        temperature; their data's chat template), chosen by the calls' ``adapter=NAME``."""
        self.cfg = cfg
        self._cfgs = dict(adapters or {})
        self.rank = rank
        self.version = 0  # of the adapter being served
        self.adapter = ""  # the adapter the engine serves ("": the run's one adapter)
        self._kept: dict[str, AdapterUpdate] = {}  # several adapters: each one's newest update
        self._versions: dict[str, int] = {}  # ... and its version
        self._serving: AdapterUpdate | None = None  # several adapters: the update the engine holds (None: the base)
        self.engine: Generator | None = None
        self.store: AdapterStore | None = None
        self.merger: LoraMerger | None = None  # rollout.adapter_mode merged: the base weights
        self._asleep = False  # colocated on GPU: weights and KV cache released for the learner
        self.transport = make_transport(cfg)
        self.envs = EnvSource.from_config(cfg.rollout)  # None: single turn, the plain generate path
        self.user_fn = UserRollouts.from_config(cfg.rollout)  # rollout.rollout_fn (replaces the environment)
        self.agent = AgentRollouts.from_config(cfg.rollout, cfg.model.path)  # rollout.agent: an OpenAI-API agent

    # -- lifecycle -------------------------------------------------------------------------
    def setup(self, peers_on_node: int = 1, index_on_node: int = 0, learners_on_node: int = 0) -> dict[str, Any]:
        import os

        import torch

        # the hf backend's threads; a vLLM CPU engine binds its own OpenMP threads to these CPUs
        torch.set_num_threads(torch_threads(self.cfg, "rollout", peers_on_node)[0])
        bind, why = engine_cpus(self.cfg, index_on_node, peers_on_node, learners_on_node,
                                sorted(os.sched_getaffinity(0)))
        if bind is not None:
            os.environ[BIND_ENV] = bind  # read by the engine process started below
        t0 = time.perf_counter()
        seed = self.cfg.rollout.seed if self.cfg.rollout.seed is not None else self.cfg.trainer.seed
        with StartWatch(self) as watch:  # a heartbeat during the start sees the engine's processes
            try:
                self.engine = self._make_engine(seed + 1000 * self.rank)
            except Exception as e:
                lost = watch.lost()
                if lost and not exited_on_its_own(e):
                    # killed (the OOM killer, a user) or stopped under it, not a refusal: replaced
                    raise EngineProcessLost(f"engine process {describe(lost)} while the engine started: "
                                            f"{e.__class__.__name__}: {e}") from e
                self.engine_pids = {}  # a start that failed on its own: its exited processes are no news
                raise
        # the engine's processes (none in process), by StartWatch's rule: the heartbeat reports them stopped
        # or gone. Not every child: a helper that exits normally (a compiler's worker) is no engine lost
        self.engine_pids = engine_processes()
        mode, _ = adapter_mode(self.cfg)
        # merged: the engine copies a version in when it reloads, so only the newest is kept on disk
        keep = 1 if mode == "merged" else self.cfg.sync.keep_versions
        self.store = AdapterStore(self.cfg.sync.tmp_dir, keep=keep, tag=f"rollout{self.rank}")
        if mode == "merged":
            from grpo_dist.hub import local_model_dir

            dtype = getattr(torch, engine_dtype(self.cfg)[0])  # the engine's weights
            self.merger = LoraMerger.shared(local_model_dir(self.cfg.model.path), dtype=dtype)
        return {"rank": self.rank, "backend": self.cfg.rollout.backend, "adapter_mode": mode, "cpus": bind or why,
                "startup_s": time.perf_counter() - t0}

    def _make_engine(self, seed: int) -> Generator:
        return make_generator(self.cfg, seed)

    def ready(self) -> bool:
        return self.engine is not None

    def close(self) -> None:
        self.engine_pids = {}  # its processes end now
        if self.agent is not None:
            self.agent.close()
        if self.engine is not None:
            self.engine.close()
        if self.store is not None:
            self.store.close()

    # -- generation ------------------------------------------------------------------------
    def sampling_spec(self, n: int | None = None, temperature: float | None = None, seed: int | None = None,
                      adapter: str | None = None) -> SamplingSpec:
        r = self._cfgs.get(adapter, self.cfg).rollout
        return SamplingSpec(n=n or r.group_size, temperature=r.temperature if temperature is None else temperature,
                            top_p=r.top_p, top_k=r.top_k, max_tokens=r.max_tokens, stop=list(r.stop), seed=seed)

    def generate(self, prompts: list[Any], n: int | None = None, temperature: float | None = None,
                 seed: int | None = None, keys: list[SeedKey] | None = None,
                 adapter: str | None = None) -> list[RolloutGroup]:
        """``prompts`` are ``PromptRecord``s (id, prompt, columns). Returns one group per prompt.

        Sampling seeds: ``keys[i] = (seed, step, prompt index)`` gives completion j of prompt i
        the seed ``sample_seed(*keys[i], j)``; without keys, ``seed`` stands for the keys
        ``(seed, 0, record id)``; with neither, the engine's own random stream is used."""
        assert self.engine is not None, "call setup() first"
        self.serve(adapter)
        spec, seeds, ids = self._prepare(prompts, n, temperature, seed, keys, adapter)
        if self.agent is not None:  # an OpenAI-API agent: its requests recorded token in, token out
            return self.agent.generate(self.engine, prompts, ids, spec, seeds, self.cfg.model.max_model_len,
                                       self.version)
        if self.user_fn is not None:  # the user's rollout function: its ids, masks and log-probs, checked
            return self.user_fn.generate(self.engine, prompts, ids, spec, seeds, self.cfg.model.max_model_len,
                                         self.version)
        if self.envs is not None:  # a multi-turn environment: trajectories, token in, token out
            return run_trajectories(self.engine, prompts, ids, spec, seeds, self.envs, self.cfg.model.max_model_len,
                                    self.version)
        with progress_of(self.engine).call():
            samples = self.engine.generate(ids, spec, seeds=seeds)
        return [self._group(rec, pids, outs, self.version) for rec, pids, outs in zip(prompts, ids, samples)]

    def _prepare(self, prompts, n, temperature, seed, keys, adapter=None):
        """The sampling spec, the per-sample seeds (or None) and the prompt ids of ``generate``."""
        spec = self.sampling_spec(n, temperature, None, adapter)
        if spec.greedy:
            spec.n = 1 if n is None else n
        if keys is None and seed is not None:
            keys = [(int(seed), 0, int(p.id)) for p in prompts]
        if keys is not None and len(keys) != len(prompts):
            raise ValueError(f"{len(keys)} seed keys for {len(prompts)} prompts")
        seeds = sample_seeds(keys, spec.n) if keys is not None and not spec.greedy else None
        add_special = not self._cfgs.get(adapter, self.cfg).data.chat_template  # a chat template holds the BOS
        return spec, seeds, self.engine.tokenize([p.prompt for p in prompts], add_special_tokens=add_special)

    @staticmethod
    def _group(rec, pids, outs, version: int) -> RolloutGroup:
        return RolloutGroup(prompt_id=rec.id, rollouts=[
            Rollout(prompt_id=rec.id, prompt=rec.prompt, prompt_ids=list(pids), completion=s.text,
                    completion_ids=s.token_ids, logprobs=s.logprobs, finish_reason=s.finish_reason,
                    adapter_version=min(s.versions, default=version) if s.versions else version,
                    columns=dict(rec.columns), token_versions=s.versions)
            for s in outs])

    # -- weight sync -----------------------------------------------------------------------
    def load_update(self, payload: object, adapter: str | None = None) -> dict[str, float]:
        """The engine half of a payload transport (``sync.transport`` object_store / filesystem):
        receive version v+1 and serve it from now on (:meth:`load_weights`)."""
        t0 = time.perf_counter()
        out = self.load_weights(self.transport.receive(payload), adapter)
        out["seconds"] = time.perf_counter() - t0
        return out

    def load_weights(self, update: AdapterUpdate, adapter: str | None = None) -> dict[str, float]:
        """Serve ``update`` (named tensors: a LoRA adapter or full weights, versioned) from now on,
        whatever carried it; colocated on GPU the sleeping engine wakes its weights first, then
        its KV cache. The answer: version, bytes received, seconds, where they went. ``adapter``:
        the adapter it is a version of (kept; loaded only if that adapter is being served)."""
        if adapter is not None:
            if update.version < self._versions.get(adapter, 0):
                raise ValueError(f"rollout worker {self.rank}: got version {update.version} of adapter {adapter!r} "
                                 f"older than {self._versions[adapter]}")
            self._kept[adapter], self._versions[adapter] = update, update.version
            return {"version": update.version, "bytes": update.nbytes, "seconds": 0.0, "load_s": 0.0,
                    "wake_s": 0.0, "deferred": 1.0}  # loaded by the next generate call for it (serve)
        t0 = time.perf_counter()
        update, path, nbytes, clocks = self._store_update(update)
        t1 = time.perf_counter()
        asleep, self._asleep = self._asleep, False
        if asleep:  # weights first, then the KV cache: waking both at once is the known OOM
            self.engine.wake_up(["weights"])
        t_woke = time.perf_counter()
        try:
            if path is None and update.is_lora:  # merged mode, in memory: each weight merged as it is taken
                self.engine.load_state(self.merger.iter_merged(update.tensors, update.peft_config, partial=True))
            elif path is None:  # full weights, in memory: straight from the payload's buffers
                self.engine.load_state(iter(update.tensors.items()))
            elif update.is_lora:
                self.engine.set_adapter(update.version, str(path))
            else:
                self.engine.load_full_weights(str(path))
        finally:  # a failed load too: the engine keeps serving the version it had, awake
            t_loaded = time.perf_counter()
            if asleep:
                self.engine.wake_up(["kv_cache"])
        self.version = update.version
        t2 = time.perf_counter()
        wake = (t_woke - t1) + (t2 - t_loaded)  # timing/sync_wake (0 unless the engine slept: colocated on GPU)
        return {"version": update.version, "bytes": nbytes, "seconds": t2 - t0, **clocks, "load_s": t2 - t1 - wake,
                "wake_s": wake}

    def _store_update(self, update: AdapterUpdate) -> tuple[AdapterUpdate, Any, int, dict[str, float]]:
        """Version v+1 (as received) as the engine will load it (merged into the base in merged
        mode), written to the store: (update, its directory, the bytes sent, the seconds spent
        merging and writing). Merged mode with an engine that loads from memory: the adapter as
        received and no directory (``load_weights`` merges it as the engine loads it)."""
        assert self.engine is not None and self.store is not None
        if update.version < self.version:
            raise ValueError(f"rollout worker {self.rank}: got version {update.version} older than {self.version}")
        nbytes = update.nbytes  # what was sent (the adapter), not what the engine reloads
        t0 = time.perf_counter()
        in_memory = getattr(self.engine, "loads_in_memory", False)  # loaded in place from the payload: nothing on disk
        if in_memory and (self.merger is not None or not update.is_lora):  # (merged weight by weight as it loads)
            return update, None, nbytes, {"merge_s": 0.0, "write_s": 0.0}
        if update.is_lora and self.merger is not None:
            update = AdapterUpdate(update.version, self.merger.merged(update.tensors, update.peft_config, partial=True),
                                   None)
        t1 = time.perf_counter()
        path = self.store.write(update)
        return update, path, nbytes, {"merge_s": t1 - t0, "write_s": time.perf_counter() - t1}

    def serve(self, adapter: str | None) -> None:
        """Make the engine serve ``adapter``'s newest weights (None: nothing to do). A merging engine
        whose weights hold something else reloads that adapter merged into the base (the base
        itself while the adapter is at version 0)."""
        if adapter is None:
            return
        update = self._kept.get(adapter)
        if update is not self._serving:
            if self.merger is None or not getattr(self.engine, "loads_in_memory", False):
                raise RuntimeError("several adapters need engines that merge adapters in memory "
                                   "(rollout.adapter_mode merged, the vLLM engine in the actor's process)")
            if update is None:
                self.engine.load_state(self.merger.iter_merged(None, None))
            else:
                self.engine.load_state(self.merger.iter_merged(update.tensors, update.peft_config, partial=True))
            self._serving = update
        self.adapter, self.version = adapter, self._versions.get(adapter, 0)

    def sleep(self) -> bool:
        """Release GPU memory for the colocated learner (no-op unless ``sleeps_while_learning``);
        the next ``load_update`` wakes the engine."""
        if sleeps_while_learning(self.cfg) and not self._asleep:
            self.engine.sleep(level=1)
            self._asleep = True
        return self._asleep

    def load_adapter_dir(self, path: str | None, version: int) -> dict[str, Any]:
        """Serve a PEFT adapter directory from disk as ``version`` (None: the base model)."""
        assert self.engine is not None and self.store is not None
        if self.merger is None:
            self.engine.set_adapter(version, path)
        else:
            tensors, peft_config = read_adapter_dir(path) if path is not None else (None, None)
            if getattr(self.engine, "loads_in_memory", False):
                self.engine.load_state(self.merger.iter_merged(tensors, peft_config, partial=True))
            else:
                merged = AdapterUpdate(version, self.merger.merged(tensors, peft_config, partial=True), None)
                self.engine.load_full_weights(str(self.store.write(merged)))
        self.version = version
        return {"version": version}

    def engine_stalled_s(self) -> float:
        """Seconds the engine's call in flight has not moved (0: none in flight); the heartbeat
        reports it (``cluster.actors.Placed.heartbeat``)."""
        return progress_of(self.engine).stalled_s() if self.engine is not None else 0.0

    def health(self) -> dict[str, Any]:
        return {"rank": self.rank, "version": self.version, "ready": self.ready()}
