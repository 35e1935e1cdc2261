"""The project's vLLM calls on a real vLLM CPU engine, section by section, in a process of its own
(run by tests/test_vllm_versions.py with the project's venv, vLLM 0.32, and with a vLLM 0.26 venv).

    python tests/vllm_probe.py MODEL_DIR WORK_DIR SECTION [SECTION ...]

Sections: prefill, control, lora, full, async. Each prints one line ``PROBE <section> <json>``
of measured values; the test asserts on them. ``control`` runs the prefill batch *without* the
workaround (vLLM's chunked prefill on, a small budget) and reports whether the engine died.
vLLM's worker processes import this module by name (``ProbeExtension``): tests/ must be on
PYTHONPATH.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
import traceback

import torch

PROMPT_LEN, N_PROMPTS, G, BUDGET, MAX_LEN = 20, 6, 3, 16, 64


class ProbeExtension:
    """A worker extension (``worker_extension_cls``), called through ``collective_rpc``: how a
    weight transport loads tensors in place on the CPU build (layerwise reload, as
    ``reload_weights`` does from files), one bucket per call."""

    def probe_info(self) -> dict:
        return {"worker": type(self).__name__, "device": str(self.device), "rank": self.rank,
                "model": type(self.model_runner.get_model()).__name__}

    def probe_log_filters(self) -> list[str]:
        """The filters on the logger vLLM 0.26 logs its per-reload "not loaded" notice from."""
        import logging

        from grpo_dist.rollout.vllm_compat import RUNNER_LOGGER

        return [type(f).__name__ for f in logging.getLogger(RUNNER_LOGGER).filters]

    def probe_begin(self) -> None:
        from vllm.model_executor.model_loader.reload import initialize_layerwise_reload

        initialize_layerwise_reload(self.model_runner.get_model())

    def probe_load(self, blob: bytes) -> int:
        """One bucket as safetensors bytes: collective_rpc's arguments are msgpack-encoded on
        the way to the engine core and decoded without types there, so a torch tensor arrives as
        a list (measured on 0.32); bytes, str, numbers, lists and dicts arrive as they left."""
        from safetensors.torch import load

        named = load(blob)
        return len(self.model_runner.get_model().load_weights(iter(named.items())) or ())

    def probe_finish(self) -> None:
        from vllm.model_executor.model_loader.reload import finalize_layerwise_reload

        finalize_layerwise_reload(self.model_runner.get_model(), self.vllm_config.model_config)


def prompts() -> list[list[int]]:
    g = torch.Generator().manual_seed(0)
    return [[1] + torch.randint(5, 90, (PROMPT_LEN - 1,), generator=g).tolist() for _ in range(N_PROMPTS)]


def seeds() -> list[list[int]]:
    return [[100 * i + j for j in range(G)] for i in range(N_PROMPTS)]


def spec(max_tokens: int = 8):
    from grpo_dist.rollout.base import SamplingSpec

    return SamplingSpec(n=G, temperature=1.0, max_tokens=max_tokens)


def hf_max_diff(model, groups, prompt_ids) -> float:
    """Max |vLLM behaviour log-prob - log_softmax(logits)| (T = 1) over every sampled token."""
    worst = 0.0
    for p, samples in zip(prompt_ids, groups):
        for s in samples:
            ids = torch.tensor([p + s.token_ids])
            with torch.no_grad():
                lp = torch.log_softmax(model(ids).logits[0].float(), -1)
            ref = [lp[len(p) + j - 1, t].item() for j, t in enumerate(s.token_ids)]
            worst = max([worst] + [abs(a - b) for a, b in zip(ref, s.logprobs)])
    return worst


def perturbed(model_dir: str, out: str, seed: int):
    """The model with every weight moved a little (seeded), saved as a checkpoint; returns it."""
    from transformers import AutoModelForCausalLM

    m = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in m.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.05)
    m.save_pretrained(out)
    return m.eval()


def engine(model_dir: str, **kw):
    from grpo_dist.rollout.vllm_engine import VLLMGenerator

    return VLLMGenerator(model_dir, max_model_len=MAX_LEN, cpu_kvcache_gb=1, **kw)


def section_prefill(model_dir: str, work: str) -> dict:
    """Seeded samples whose prompts exceed the prefill budget (6 x 3 requests x 20 tokens = 360
    tokens against a budget asked as 16): all complete, and equal each prompt run on its own."""
    eng = engine(model_dir, enable_lora=False, max_num_batched_tokens=BUDGET)
    try:
        sched = eng.llm.llm_engine.vllm_config.scheduler_config
        ps, ss = prompts(), seeds()
        batch = eng.generate(ps, spec(), ss)
        solo = [eng.generate([p], spec(), [s])[0] for p, s in zip(ps, ss)]
        same = all(a.token_ids == b.token_ids for g1, g2 in zip(batch, solo) for a, b in zip(g1, g2))
        lp = max(abs(x - y) for g1, g2 in zip(batch, solo) for a, b in zip(g1, g2) for x, y in zip(a.logprobs, b.logprobs))
        return {"chunked_prefill": sched.enable_chunked_prefill, "budget": sched.max_num_batched_tokens,
                "prompt_tokens": sum(len(p) for p in ps) * G, "samples": sum(len(g) for g in batch),
                "same_as_solo": same, "solo_logprob_diff": lp, "tokens": [[x.token_ids for x in g] for g in batch[:2]]}
    finally:
        eng.close()


def section_control(model_dir: str, work: str) -> dict:
    """The same batch without the workaround: vLLM's chunked prefill with the small budget."""
    from grpo_dist.rollout import vllm_compat

    fix = vllm_compat.cpu_prefill_kwargs
    vllm_compat.cpu_prefill_kwargs = lambda max_model_len, n=None: {
        "enable_chunked_prefill": True, "max_num_batched_tokens": BUDGET}
    try:
        eng = engine(model_dir, enable_lora=False)
    finally:
        vllm_compat.cpu_prefill_kwargs = fix  # the next sections get the workaround again
    try:
        sched = eng.llm.llm_engine.vllm_config.scheduler_config
        out = {"chunked_prefill": sched.enable_chunked_prefill, "budget": sched.max_num_batched_tokens}
        try:
            eng.generate(prompts(), spec(), seeds())
            out["crashed"] = None
        except Exception as e:  # the engine core died: vLLM raises EngineDeadError here
            out["crashed"] = f"{type(e).__name__}: {e}"[:300]
        return out
    finally:
        eng.close()


def write_adapter(model_dir: str, out: str, seed: int):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    m = get_peft_model(AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32),
                       LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"], init_lora_weights=False))
    m.save_pretrained(out)
    return m.eval()


def section_lora(model_dir: str, work: str) -> dict:
    """LoRARequest + add_lora/remove_lora (LLMEngine): served log-probs equal PEFT's."""
    eng = engine(model_dir, enable_lora=True, lora_rank=8)
    try:
        ps = prompts()[:2]
        peft1 = write_adapter(model_dir, f"{work}/a1", 1)
        write_adapter(model_dir, f"{work}/a2", 2)
        eng.set_adapter(1, f"{work}/a1")
        d1 = hf_max_diff(peft1, eng.generate(ps, spec(), seeds()[:2]), ps)
        eng.set_adapter(2, f"{work}/a2")
        loaded = sorted(eng.llm.llm_engine.list_loras())
        eng.set_adapter(3, None)
        from transformers import AutoModelForCausalLM

        base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
        d0 = hf_max_diff(base, eng.generate(ps, spec(), seeds()[:2]), ps)
        return {"peft_diff": d1, "loaded_after_v2": loaded, "loaded_after_base": sorted(eng.llm.llm_engine.list_loras()),
                "base_diff": d0}
    finally:
        eng.close()


def section_full(model_dir: str, work: str) -> dict:
    """Full weights: reload_weights from a checkpoint (collective_rpc), sleep/wake_up (no-ops on
    CPU, the calls themselves), and tensors loaded in place through a worker extension."""
    eng = engine(model_dir, enable_lora=False, worker_extension_cls="vllm_probe.ProbeExtension")
    try:
        ps, ss = prompts()[:2], seeds()[:2]
        info = eng.llm.collective_rpc("probe_info")
        m1 = perturbed(model_dir, f"{work}/w1", 1)
        t = time.perf_counter()
        eng.load_full_weights(f"{work}/w1")
        reload_s = time.perf_counter() - t
        d1 = hf_max_diff(m1, eng.generate(ps, spec(), ss), ps)
        eng.sleep(1)
        eng.wake_up(["weights"])
        eng.wake_up(["kv_cache"])
        m2 = perturbed(model_dir, f"{work}/w2", 2)
        from safetensors.torch import save

        named = [(n, p.detach().clone()) for n, p in m2.state_dict().items()]
        half = len(named) // 2  # two buckets: a layer's q/k/v or gate/up may straddle them
        t = time.perf_counter()
        eng.llm.collective_rpc("probe_begin")
        loaded = sum(eng.llm.collective_rpc("probe_load", args=(save(dict(b)),))[0] for b in (named[:half], named[half:]))
        eng.llm.collective_rpc("probe_finish")
        eng.llm.reset_prefix_cache()
        rpc_s = time.perf_counter() - t
        d2 = hf_max_diff(m2, eng.generate(ps, spec(), ss), ps)
        # a checkpoint with one tensor (as merged serving writes the layers an adapter changes):
        # vLLM warns per reload about the rest; the test finds no such warning in the output
        os.makedirs(f"{work}/w3", exist_ok=True)
        from safetensors.torch import save_file

        save_file({"model.layers.0.mlp.down_proj.weight": m1.model.layers[0].mlp.down_proj.weight.detach().clone()},
                  f"{work}/w3/model.safetensors")
        eng.load_full_weights(f"{work}/w3")
        return {"info": info, "reload_diff": d1, "rpc_diff": d2, "rpc_loaded": loaded, "tensors": len(named),
                "reload_s": reload_s, "rpc_s": rpc_s, "log_filters": eng.llm.collective_rpc("probe_log_filters")}
    finally:
        eng.close()


def section_async(model_dir: str, work: str) -> dict:
    """AsyncLLM: seeded groups (their tokens: the same as the batch engine's, compared by the
    test) and a LoRA version served to the groups that ask for it."""
    from grpo_dist.rollout.async_vllm import AsyncVLLMGenerator

    peft1 = write_adapter(model_dir, f"{work}/b1", 1)
    ps, ss = prompts()[:2], seeds()[:2]

    async def run(gen):
        base = [await gen.generate_group(p, spec(), s) for p, s in zip(ps, ss)]
        await gen.set_adapter(1, f"{work}/b1")
        tuned = await asyncio.gather(*[gen.generate_group(p, spec(), s, min_version=1) for p, s in zip(ps, ss)])
        return base, tuned

    gen = AsyncVLLMGenerator(model_dir, enable_lora=True, lora_rank=8, max_model_len=MAX_LEN, cpu_kvcache_gb=1)
    try:
        base, tuned = asyncio.run(run(gen))
    finally:
        gen.close()
    return {"versions": [v for _, v in base] + [v for _, v in tuned],
            "peft_diff": hf_max_diff(peft1, [s for s, _ in tuned], ps),
            "base_tokens": [[x.token_ids for x in s] for s, _ in base]}


def main() -> None:
    model_dir, work, names = sys.argv[1], sys.argv[2], sys.argv[3:]
    import vllm

    from grpo_dist.util.procenv import setup_env

    setup_env()
    print("PROBE version " + json.dumps({"vllm": vllm.__version__, "torch": torch.__version__}), flush=True)
    for name in names:
        t = time.perf_counter()
        try:
            out = globals()[f"section_{name}"](model_dir, work)
        except Exception:
            out = {"error": traceback.format_exc()[-3000:]}
        out["seconds"] = round(time.perf_counter() - t, 1)
        print(f"PROBE {name} " + json.dumps(out), flush=True)
    os._exit(0)  # every engine above is shut down; skip vLLM's atexit handlers


if __name__ == "__main__":
    main()
