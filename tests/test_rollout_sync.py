"""Rollout worker on the transformers backend (fast, no vLLM), adapter store and transports."""

from __future__ import annotations

import json

import pytest
import torch

from grpo_dist.config import ConfigError, load_config
from grpo_dist.data import PromptRecord
from grpo_dist.sync import AdapterStore, FilesystemTransport, ObjectStoreTransport, make_transport
from grpo_dist.types import AdapterUpdate


def lora_update(model_dir, version: int, seed: int = 0) -> AdapterUpdate:
    from peft import LoraConfig, get_peft_model, get_peft_model_state_dict
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    m = get_peft_model(AutoModelForCausalLM.from_pretrained(model_dir),
                       LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"], init_lora_weights=False))
    cfg = {k: (sorted(v) if isinstance(v, set) else v) for k, v in m.peft_config["default"].to_dict().items()}
    cfg = json.loads(json.dumps(cfg))  # JSON-safe, as the learner exports it
    return AdapterUpdate(version, {k: v.detach().clone() for k, v in get_peft_model_state_dict(m).items()}, cfg), m


@pytest.fixture(scope="module")
def hf_worker(tiny_model_dir):
    from grpo_dist.rollout.worker import RolloutWorker

    cfg = load_config(None, ["--model.path", str(tiny_model_dir), "--rollout.backend", "hf",
                             "--rollout.max_tokens", "5", "--rollout.group_size", "3",
                             "--learner.micro_batch_size", "24"])
    w = RolloutWorker(cfg)
    w.setup()
    yield w
    w.close()


def recs(n=2):
    return [PromptRecord(id=i, prompt=f"{i}+{i}=", columns={"answer": str(2 * i)}) for i in range(n)]


def test_hf_rollouts_have_ids_logprobs_and_version(hf_worker):
    groups = hf_worker.generate(recs(2), seed=0)
    assert [g.prompt_id for g in groups] == [0, 1]
    for g in groups:
        assert len(g.rollouts) == 3
        for r in g.rollouts:
            assert r.prompt_ids[0] == hf_worker.engine.tokenizer.bos_token_id
            assert 1 <= len(r.completion_ids) <= 5 and len(r.logprobs) == len(r.completion_ids)
            assert all(lp <= 0 for lp in r.logprobs)
            assert r.finish_reason in ("stop", "length") and r.adapter_version == 0
            assert r.columns["answer"] == str(2 * r.prompt_id)


def test_hf_logprobs_are_the_temperature_scaled_distribution(hf_worker):
    """Behaviour log-probs must equal log_softmax(logits / T) of the same model on the same tokens."""
    from transformers import AutoModelForCausalLM

    hf_worker.cfg.rollout.temperature = 0.7
    try:
        r = hf_worker.generate(recs(1), seed=1)[0].rollouts[0]
    finally:
        hf_worker.cfg.rollout.temperature = 1.0
    m = AutoModelForCausalLM.from_pretrained(hf_worker.cfg.model.path)
    ids = torch.tensor([r.prompt_ids + r.completion_ids])
    with torch.no_grad():
        lp = torch.log_softmax(m(ids).logits[0] / 0.7, -1)
    p = len(r.prompt_ids)
    expect = [lp[p + j - 1, t].item() for j, t in enumerate(r.completion_ids)]
    assert max(abs(a - b) for a, b in zip(expect, r.logprobs)) < 1e-4


def test_hf_max_batch_size_reaches_the_engine_and_leaves_seeded_samples_alone(hf_worker, tiny_model_dir):
    """rollout.hf_max_batch_size cuts the decode into chunks; seeded rollouts stay the same."""
    from grpo_dist.rollout.worker import RolloutWorker

    cfg = hf_worker.cfg.model_copy(deep=True)
    cfg.rollout.hf_max_batch_size = 2
    small = RolloutWorker(cfg)
    small.setup()
    try:
        assert small.engine.max_batch_size == 2 and hf_worker.engine.max_batch_size == 128
        chunked = small.generate(recs(4), seed=3)
    finally:
        small.close()
    whole = hf_worker.generate(recs(4), seed=3)
    assert [[r.completion_ids for r in g.rollouts] for g in whole] == \
        [[r.completion_ids for r in g.rollouts] for g in chunked]


def test_greedy_is_deterministic_and_seeded_sampling_reproducible(hf_worker):
    a = hf_worker.generate(recs(2), temperature=0.0)
    b = hf_worker.generate(recs(2), temperature=0.0)
    assert [g.rollouts[0].completion_ids for g in a] == [g.rollouts[0].completion_ids for g in b]
    assert all(len(g.rollouts) == 1 for g in a)
    s1 = hf_worker.generate(recs(2), seed=5)
    s2 = hf_worker.generate(recs(2), seed=5)
    assert [[r.completion_ids for r in g.rollouts] for g in s1] == [[r.completion_ids for r in g.rollouts] for g in s2]


def test_load_update_changes_the_policy_and_version(hf_worker, tiny_model_dir):
    upd, peft_model = lora_update(tiny_model_dir, version=1)
    before = hf_worker.generate(recs(1), temperature=0.0)[0].rollouts[0]
    info = hf_worker.load_update(upd)
    assert info["version"] == 1 and info["bytes"] == upd.nbytes > 0
    after = hf_worker.generate(recs(1), temperature=0.0)[0].rollouts[0]
    assert after.adapter_version == 1
    ids = torch.tensor([after.prompt_ids + after.completion_ids])
    with torch.no_grad():
        lp = torch.log_softmax(peft_model(ids).logits[0], -1)
    p = len(after.prompt_ids)
    assert abs(lp[p, after.completion_ids[1]].item() - after.logprobs[1]) < 1e-4
    assert before.logprobs != after.logprobs
    with pytest.raises(ValueError, match="older"):
        hf_worker.load_update(AdapterUpdate(0, upd.tensors, upd.peft_config))


def test_adapter_store_writes_peft_dirs_and_evicts(tmp_path, tiny_model_dir):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    store = AdapterStore(tmp_path, keep=2)
    upd, _ = lora_update(tiny_model_dir, version=1)
    paths = [store.write(AdapterUpdate(v, upd.tensors, upd.peft_config)) for v in (1, 2, 3)]
    assert not paths[0].exists() and paths[1].exists() and paths[2].exists()
    assert json.loads((paths[2] / "adapter_config.json").read_text())["r"] == 8
    PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_model_dir), str(paths[2]))
    # the same version again (a load re-issued after a worker was replaced) is idempotent: it must
    # not count twice and evict itself
    for _ in range(3):
        again = store.write(AdapterUpdate(3, upd.tensors, upd.peft_config))
        assert again == paths[2] and (again / "adapter_model.safetensors").is_file() and paths[1].exists()
    store.close()
    assert not store.root.exists()


def test_transports_round_trip(tmp_path, tiny_model_dir):
    upd, _ = lora_update(tiny_model_dir, version=4)
    for t in (ObjectStoreTransport(), FilesystemTransport(tmp_path, keep=1)):
        got = t.receive(t.publish(upd))
        assert got.version == 4 and got.peft_config == upd.peft_config
        assert all(torch.equal(got.tensors[k], upd.tensors[k]) for k in upd.tensors)
    fs = FilesystemTransport(tmp_path, keep=1)
    fs.publish(AdapterUpdate(5, upd.tensors, upd.peft_config))
    assert sorted(p.name for p in tmp_path.glob("v*.pt")) == ["v5.pt"]
    cfg = load_config(None, ["--sync.transport", "filesystem", "--cluster.shared_dir", str(tmp_path),
                             "--trainer.run_id", "r1"])
    t = make_transport(cfg)
    assert isinstance(t, FilesystemTransport) and t.dir == tmp_path / "r1" / "sync"
    with pytest.raises(ConfigError, match="^sync.transport: filesystem needs cluster.shared_dir"):
        load_config(None, ["--sync.transport", "filesystem"])
    with pytest.raises(TypeError):
        ObjectStoreTransport().receive("not an update")
