"""Serving LoRA versions as merged weights (rollout.adapter_mode) and the machine-dependent defaults
that are chosen at start (adapter mode, trainer.max_staleness auto)."""

from __future__ import annotations

import json

import pytest
import torch

from grpo_dist.config import load_config
from grpo_dist.data import PromptRecord
from grpo_dist.devices import adapter_mode, choices, engine_dtype, trainable_dtype
from grpo_dist.sync.merge import LoraMerger, MergeError, lora_factors, read_adapter_dir
from grpo_dist.types import AdapterUpdate


def peft_model(model_dir, seed=0, **lora):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    kw = dict(r=8, lora_alpha=16, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"], init_lora_weights=False)
    kw.update(lora)
    return get_peft_model(AutoModelForCausalLM.from_pretrained(model_dir), LoraConfig(**kw))


def as_update(m, version=1) -> AdapterUpdate:
    from peft import get_peft_model_state_dict

    cfg = json.loads(json.dumps({k: (sorted(v) if isinstance(v, set) else v)
                                 for k, v in m.peft_config["default"].to_dict().items()}))
    return AdapterUpdate(version, {k: v.detach().clone() for k, v in get_peft_model_state_dict(m).items()}, cfg)


@pytest.mark.parametrize("lora", [{}, {"use_rslora": True, "lora_alpha": 5}, {"r": 4, "target_modules": ["v_proj"]}])
def test_merged_state_equals_peft_merge_and_unload(tiny_model_dir, lora):
    m = peft_model(tiny_model_dir, **lora)
    upd = as_update(m)
    merged = LoraMerger(tiny_model_dir).merged(upd.tensors, upd.peft_config)
    expect = m.merge_and_unload().state_dict()
    changed = 0
    for k, v in expect.items():
        if k == "lm_head.weight" and k not in merged:  # tied to the embeddings
            continue
        assert torch.allclose(merged[k], v, atol=1e-6), k
        changed += int(not torch.equal(merged[k], LoraMerger(tiny_model_dir).base[k]))
    n_targets = len(lora.get("target_modules", ["q", "k", "v", "o"]))
    assert changed == n_targets * 2  # every targeted projection of the tiny model's 2 layers, nothing else


def test_merger_casts_to_the_engine_dtype_after_merging(tiny_model_dir):
    """A bfloat16 engine gets bf16(W + delta) from the stored float32 weights, the partial state's
    untouched stack members and the base itself in bfloat16 too."""
    upd = as_update(peft_model(tiny_model_dir))
    fp32, bf16 = LoraMerger(tiny_model_dir), LoraMerger(tiny_model_dir, dtype=torch.bfloat16)
    for partial in (False, True):
        want, got = fp32.merged(upd.tensors, upd.peft_config, partial), bf16.merged(upd.tensors, upd.peft_config, partial)
        assert got.keys() == want.keys() and {v.dtype for v in want.values()} == {torch.float32}
        assert {v.dtype for v in got.values()} == {torch.bfloat16}
        assert all(torch.equal(got[k], want[k].to(torch.bfloat16)) for k in want)
    assert {v.dtype for v in bf16.merged(None, None).values()} == {torch.bfloat16}


@pytest.mark.parametrize("targets, reloaded", [
    (["q_proj", "k_proj", "v_proj", "o_proj"], {"q_proj", "k_proj", "v_proj", "o_proj"}),
    (["v_proj"], {"q_proj", "k_proj", "v_proj"}),  # vLLM's qkv_proj is reloaded whole
    (["up_proj", "o_proj"], {"gate_proj", "up_proj", "o_proj"}),
])
def test_partial_state_is_whole_vllm_layers(tiny_model_dir, targets, reloaded):
    upd = as_update(peft_model(tiny_model_dir, target_modules=targets))
    merger = LoraMerger(tiny_model_dir)
    full = merger.merged(upd.tensors, upd.peft_config)
    part = merger.merged(upd.tensors, upd.peft_config, partial=True)
    assert {k.rsplit(".", 2)[1] for k in part} == reloaded
    assert len(part) == 2 * len(reloaded)  # both layers of the tiny model, weights only (no biases)
    assert all(torch.equal(part[k], full[k]) for k in part)


def test_partial_state_carries_the_biases_of_a_stacked_layer(tiny_model_dir):
    """Qwen2-style q/k/v biases belong to vLLM's qkv_proj layer: they are reloaded with it."""
    merger = LoraMerger(tiny_model_dir)
    for i in range(2):
        for m in ("q_proj", "k_proj", "v_proj"):
            w = merger.base[f"model.layers.{i}.self_attn.{m}.weight"]
            merger.base[f"model.layers.{i}.self_attn.{m}.bias"] = torch.zeros(w.shape[0])
    upd = as_update(peft_model(tiny_model_dir, target_modules=["q_proj"]))
    part = merger.merged(upd.tensors, upd.peft_config, partial=True)
    assert sum(k.endswith(".bias") for k in part) == 6 and len(part) == 12


def test_an_unknown_projection_reloads_the_whole_state(tiny_model_dir):
    upd = as_update(peft_model(tiny_model_dir, target_modules=["q_proj"]))
    renamed = {k.replace("q_proj", "c_attn"): v for k, v in upd.tensors.items()}
    merger = LoraMerger(tiny_model_dir)
    for i in range(2):
        merger.base[f"model.layers.{i}.self_attn.c_attn.weight"] = merger.base[f"model.layers.{i}.self_attn.q_proj.weight"]
    part = merger.merged(renamed, upd.peft_config, partial=True)
    assert set(part) == set(merger.base)


def test_base_is_returned_unchanged_and_bad_adapters_are_refused(tiny_model_dir, tmp_path):
    merger = LoraMerger(tiny_model_dir)
    assert all(torch.equal(a, merger.base[k]) for k, a in merger.merged(None, None).items())
    upd = as_update(peft_model(tiny_model_dir))
    with pytest.raises(MergeError, match="use_dora"):
        lora_factors(upd.tensors, {**upd.peft_config, "use_dora": True})
    only_a = {k: v for k, v in upd.tensors.items() if ".lora_A." in k}
    with pytest.raises(MergeError, match="no lora_B partner"):
        lora_factors(only_a, upd.peft_config)
    renamed = {k.replace("q_proj", "qq_proj"): v for k, v in upd.tensors.items()}
    with pytest.raises(MergeError, match="does not have"):
        merger.merged(renamed, upd.peft_config)
    with pytest.raises(MergeError, match="no \\*.safetensors"):
        LoraMerger(tmp_path)


def test_adapter_dir_round_trip(tiny_model_dir, tmp_path):
    m = peft_model(tiny_model_dir, seed=3)
    m.save_pretrained(str(tmp_path / "a"))
    tensors, cfg = read_adapter_dir(tmp_path / "a")
    upd = as_update(m)
    assert cfg["r"] == 8 and set(tensors) == set(upd.tensors)


def rollout_worker(model_dir, mode, *extra, backend="hf"):
    from grpo_dist.rollout.worker import RolloutWorker

    cfg = load_config(None, ["--model.path", str(model_dir), "--rollout.backend", backend, "--rollout.max_tokens", "6",
                             "--rollout.group_size", "2", "--learner.micro_batch_size", "4",
                             "--rollout.adapter_mode", mode, "--rollout.engine_in_process", "false",
                             "--model.dtype", "float32", *extra])  # float32 unless extra says otherwise
    # a vLLM engine in this (pytest) process: in vLLM's own engine process, so that vLLM's
    # process-wide state (default process group, OpenMP binding) does not stay for later tests
    w = RolloutWorker(cfg)
    info = w.setup()
    assert info["adapter_mode"] == mode
    return w


def serve_four(model_dir, mode, upd, adapter_dir, *extra, backend="hf"):
    """Greedy (ids, log-probs) of a worker serving the base, version 1 (``upd``, sent), the
    adapter directory (eval) as 2, the base again as 3; whether it loaded from memory; the
    versions it wrote to its store."""
    recs = [PromptRecord(id=i, prompt=f"{i}+{2 * i}=", columns={}) for i in range(3)]

    def flat(groups):
        return [(r.completion_ids, r.logprobs) for g in groups for r in g.rollouts]

    w = rollout_worker(model_dir, mode, *extra, backend=backend)
    try:
        base = flat(w.generate(recs, temperature=0.0))
        info = w.load_update(upd)
        assert info["bytes"] == upd.nbytes  # what travelled is the adapter, in every mode
        clocks = [info[k] for k in ("merge_s", "write_s", "load_s")]
        assert min(clocks) >= 0 and sum(clocks) <= info["seconds"] + 1e-6
        written = w.store.versions  # the versions written to disk for the engine to read
        trained = flat(w.generate(recs, temperature=0.0))
        w.load_adapter_dir(str(adapter_dir), 2)
        from_dir = flat(w.generate(recs, temperature=0.0))
        w.load_adapter_dir(None, 3)
        base_again = flat(w.generate(recs, temperature=0.0))
        return (base, trained, from_dir, base_again), bool(w.engine.loads_in_memory), list(written + w.store.versions)
    finally:
        w.close()


def _serve_in_process_engine(model_dir, upd, adapter_dir):
    # in a spawned process: an engine core in this process leaves vLLM's process-wide state behind
    return serve_four(model_dir, "merged", upd, adapter_dir, "--rollout.engine_in_process", "true", backend="vllm")


def assert_same_policy(a, b):
    for x, y in zip(a, b):
        for (ids_a, lp_a), (ids_b, lp_b) in zip(x, y):
            assert ids_a == ids_b
            assert max(abs(p - q) for p, q in zip(lp_a, lp_b)) < 1e-5


def test_merged_and_lora_workers_serve_the_same_policy(tiny_model_dir, tmp_path):
    """The same adapter through both modes: the same greedy tokens, log-probs equal to 1e-5;
    an adapter directory (eval) and the base (path None) through the merged worker too."""
    m = peft_model(tiny_model_dir, seed=1)
    upd = as_update(m, version=1)
    m.save_pretrained(str(tmp_path / "adapter"))
    lora, _, _ = serve_four(tiny_model_dir, "lora", upd, tmp_path / "adapter")
    merged, in_memory, written = serve_four(tiny_model_dir, "merged", upd, tmp_path / "adapter")
    assert not in_memory and written  # the hf engine loads a directory
    assert_same_policy(lora, merged)
    base, trained, from_dir, base_again = merged
    assert base != trained  # the adapter changed the policy
    assert [x[0] for x in trained] == [x[0] for x in from_dir]
    assert base_again == base


@pytest.mark.slow  # a vLLM engine start in a spawned process
def test_an_engine_in_the_actors_process_loads_merged_versions_from_memory(tiny_model_dir, tmp_path, monkeypatch):
    """A vLLM engine core in the worker's process (the CPU default) takes each merged version
    weight by weight from the merger, nothing written: the same policy as the LoRA worker's, and
    no merged checkpoint in the store."""
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor
    from pathlib import Path

    m = peft_model(tiny_model_dir, seed=1)
    upd = as_update(m, version=1)
    m.save_pretrained(str(tmp_path / "adapter"))
    lora, _, _ = serve_four(tiny_model_dir, "lora", upd, tmp_path / "adapter")
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1]))  # the child unpickles tests.test_merge
    with ProcessPoolExecutor(1, mp_context=mp.get_context("spawn")) as pool:
        merged, in_memory, written = pool.submit(_serve_in_process_engine, str(tiny_model_dir), upd,
                                                 tmp_path / "adapter").result()
    assert in_memory and written == []
    assert_same_policy(lora, merged)
    assert merged[0] != merged[1] and merged[3] == merged[0]


@pytest.mark.slow
@pytest.mark.heavy  # make test-all: a compiled CPU engine (rollout.enforce_eager: false, not the default); every
# eager engine's merged versions in make test (test_presets_e2e, and the test below, from memory)
def test_compiled_vllm_engine_serves_each_merged_version(tiny_model_dir):
    """Greedy tokens and log-probs of the base, version 1 and version 2 (two different adapters)
    from a compiled engine equal the float32 HF worker's (the same merged weights) to 1e-4, and the
    versions differ from each other: a reload the compiled graph missed would repeat the base."""
    recs = [PromptRecord(id=i, prompt=f"{i}+{2 * i}=", columns={}) for i in range(4)]
    updates = [as_update(peft_model(tiny_model_dir, seed=s), version=v) for v, s in ((1, 1), (2, 2))]

    def run(w):
        try:
            outs = [w.generate(recs, temperature=0.0)]
            for upd in updates:
                w.load_update(upd)
                outs.append(w.generate(recs, temperature=0.0))
        finally:
            w.close()
        return [[(r.completion_ids, r.logprobs) for g in out for r in g.rollouts] for out in outs]

    w = rollout_worker(tiny_model_dir, "merged", "--rollout.enforce_eager", "false", backend="vllm")
    assert w.cfg.rollout.enforce_eager is False
    compiled = run(w)
    reference = run(rollout_worker(tiny_model_dir, "merged"))
    assert compiled[0] != compiled[1] != compiled[2]  # each version changed the policy
    for got, want in zip(compiled, reference):
        assert len(got) == len(want) == len(recs)  # greedy: one completion per prompt
        for (ids_a, lp_a), (ids_b, lp_b) in zip(got, want):
            assert ids_a == ids_b
            assert max(abs(x - y) for x, y in zip(lp_a, lp_b)) < 1e-4


def test_rollout_dtype_serves_a_rounded_copy_of_the_merged_policy(tiny_model_dir):
    """rollout.dtype bfloat16 with model.dtype float32: the engine holds bfloat16 weights, a merged
    version lands in them, and its log-probs are the float32 policy's to bfloat16 rounding (close,
    not equal: the learner keeps float32)."""
    recs = [PromptRecord(id=i, prompt=f"{i}+{2 * i}=", columns={}) for i in range(3)]
    upd = as_update(peft_model(tiny_model_dir, seed=1), version=1)
    out = {}
    for dtype in ("float32", "bfloat16"):
        w = rollout_worker(tiny_model_dir, "merged", "--rollout.dtype", dtype)
        try:
            assert {p.dtype for p in w.engine.model.parameters()} == {getattr(torch, dtype)}
            assert w.cfg.model.dtype == "float32" and w.merger.dtype == getattr(torch, dtype)
            w.load_update(upd)
            assert {p.dtype for p in w.engine.model.parameters()} == {getattr(torch, dtype)}
            out[dtype] = [r for g in w.generate(recs, temperature=0.0) for r in g.rollouts]
        finally:
            w.close()
    pairs = [(a, b) for a, b in zip(out["float32"], out["bfloat16"]) if a.completion_ids == b.completion_ids]
    assert pairs  # greedy tokens mostly agree
    diffs = [abs(x - y) for a, b in pairs for x, y in zip(a.logprobs, b.logprobs)]
    assert 1e-6 < max(diffs) < 0.1, max(diffs)


# ------------------------------------------------------------------ defaults chosen at start
def test_adapter_mode_auto_by_device():
    cpu = load_config(None, ["--model.dtype", "float32"])
    assert adapter_mode(cpu)[0] == "merged"
    gpu = load_config(None, ["--cluster.rollout_gpus", "1", "--cluster.learner_gpus", "1"])
    assert adapter_mode(gpu)[0] == "lora"
    assert adapter_mode(load_config(None, ["--rollout.adapter_mode", "lora"])) == ("lora", "rollout.adapter_mode")
    assert adapter_mode(load_config(None, ["--lora.enabled", "false"]))[0] == "full"
    lines = choices(cpu)
    assert lines[0].startswith("rollout.adapter_mode -> merged: auto: CPU engines")
    assert lines[1].startswith("trainer.max_staleness auto -> 0: the engines and the learner share CPU cores")


def test_a_merging_engine_keeps_float32_weights_beside_a_bf16_learner():
    """bf16's spacing at a weight's size is larger than most of an adapter's delta: engines that
    merge the adapter get float32 weights unless rollout.dtype says otherwise (the learner keeps
    bfloat16); engines that serve the adapter unmerged, or full weights, keep model.dtype."""
    bf16 = load_config(None, ["--model.dtype", "bfloat16"])
    assert engine_dtype(bf16)[0] == "float32" and bf16.model.dtype == "bfloat16"
    assert any(x.startswith("rollout.dtype -> float32: auto: the engines merge the adapter") for x in choices(bf16))
    assert engine_dtype(load_config(None, ["--model.dtype", "float16"]))[0] == "float32"
    assert engine_dtype(load_config(None, ["--model.dtype", "bfloat16", "--rollout.dtype", "bfloat16"])) == \
        ("bfloat16", "rollout.dtype")
    assert engine_dtype(load_config(None, ["--model.dtype", "bfloat16", "--rollout.adapter_mode", "lora"])) == \
        ("bfloat16", "model.dtype")
    assert engine_dtype(load_config(None, ["--model.dtype", "bfloat16", "--lora.enabled", "false"]))[0] == "bfloat16"
    assert engine_dtype(load_config(None, ["--cluster.rollout_gpus", "1", "--cluster.learner_gpus", "1"]))[0] == \
        "bfloat16"  # GPUs: bf16 by default, the adapter served by vLLM's LoRA kernels
    fp32 = load_config(None, ["--model.dtype", "float32"])
    assert engine_dtype(fp32) == ("float32", "model.dtype") and not any("rollout.dtype" in x for x in choices(fp32))
    # the learner's adapter: float32 on a 16-bit base unless lora.dtype says model (said at start)
    assert any(x.startswith("lora.dtype -> float32: the adapter's weights") for x in choices(bf16))
    assert not any(x.startswith("lora.dtype") for x in choices(fp32))
    fp16 = load_config(None, ["--model.dtype", "float16"])  # fp16 keeps DeepSpeed's loss scaling
    assert trainable_dtype(fp16) == "float16" and not any(x.startswith("lora.dtype") for x in choices(fp16))
    assert trainable_dtype(bf16) == "float32"
    assert not any(x.startswith("lora.dtype") for x in choices(load_config(None, ["--model.dtype", "bfloat16",
                                                                                   "--lora.dtype", "model"])))


@pytest.mark.parametrize("overrides, k, words", [
    ([], 0, "share CPU cores"),
    (["--cluster.rollout_gpus", "1", "--cluster.learner_gpus", "1"], 1, "GPUs of their own"),
    (["--cluster.rollout_gpus", "1", "--cluster.learner_gpus", "1", "--algo.num_iterations", "2"], 2,
     "GPUs of their own"),
    (["--cluster.rollout_gpus", "1", "--cluster.learner_gpus", "1", "--rollout.top_p", "0.9"], 0, "top_p"),
    (["--cluster.rollout_gpus", "1", "--cluster.learner_gpus", "1", "--cluster.layout", "colocated",
      "--rollout.num_workers", "1"], 0, "colocated"),
    (["--trainer.async_rollouts", "true"], 1, "async_rollouts"),
])
def test_max_staleness_auto(overrides, k, words):
    cfg = load_config(None, overrides)
    assert cfg.trainer.max_staleness == k
    assert words in cfg.trainer._auto_staleness
    assert cfg.trainer.async_rollouts == (k > 0)


def test_explicit_max_staleness_is_kept_without_a_note():
    for k in (0, 1, 2):
        cfg = load_config(None, ["--trainer.max_staleness", str(k)])
        assert cfg.trainer.max_staleness == k and cfg.trainer._auto_staleness is None
        assert not any(line.startswith("trainer.max_staleness") for line in choices(cfg))
