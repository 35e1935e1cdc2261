"""Full weights loaded in place by a vLLM engine whose core runs in a process of its own (the GPU
default): the object store's zero-copy payload (as Ray passes it: pickle 5, the bytes out of
band) and the filesystem transport's mapped file reach the engine as shared-memory handles
(``sync.zero_copy.share``, CUDA IPC on GPUs), never as a directory: nothing is written to the
worker's store, and the engine's log-probs are HF's of the weights sent. The engine core in the
actor's process (the CPU default) and a replaced engine joining mid-run:
tests/test_presets_e2e.py::test_full_finetuning_through_vllm_reload_weights; over the collective:
tests/test_collective_e2e.py."""

from __future__ import annotations

import pickle

import e2e
import pytest

pytestmark = pytest.mark.slow


def test_payload_transports_load_in_place_through_shared_memory(tiny_model_dir, tmp_path):
    from safetensors.torch import load_file

    from grpo_dist.config import load_config
    from grpo_dist.models import make_tiny_model
    from grpo_dist.rollout.worker import RolloutWorker
    from grpo_dist.sync import FilesystemTransport, ObjectStoreTransport
    from grpo_dist.types import AdapterUpdate, PromptRecord

    other = tmp_path / "other"
    make_tiny_model(str(other), size="tiny", seed=1, log=None)
    cfg = load_config(None, {"model": {"path": str(tiny_model_dir), "dtype": "float32"},
                             "rollout": {"backend": "vllm", "max_tokens": 6, "engine_in_process": False},
                             "lora": {"enabled": False}})
    w = RolloutWorker(cfg)
    w.setup()
    try:
        assert w.engine.loads_in_memory and not w.engine.in_process
        recs = [PromptRecord(id=i, prompt=f"{i}+{2 * i}=", columns={}) for i in range(3)]

        def served() -> list:
            return [r for g in w.generate(recs, n=2, temperature=1.0, seed=3) for r in g.rollouts]

        obj = ObjectStoreTransport()
        buffers: list = []
        blob = pickle.dumps(obj.publish(AdapterUpdate(5, load_file(str(other / "model.safetensors")), None)),
                            protocol=5, buffer_callback=buffers.append)
        out = w.load_weights(obj.receive(pickle.loads(blob, buffers=[bytes(memoryview(b)) for b in buffers])))
        assert out["version"] == 5 == w.version and out["write_s"] == 0.0
        loaded, started = e2e.hf_logprob_diff(other, served()), e2e.hf_logprob_diff(tiny_model_dir, served())
        print(f"object store: engine vs HF of the weights sent {loaded:.1e}, of its own before {started:.1e}")
        assert loaded < 1e-4 and started > 1e-2

        fs = FilesystemTransport(tmp_path / "shared")  # back to the weights it started with
        path = fs.publish(AdapterUpdate(6, load_file(str(tiny_model_dir / "model.safetensors")), None))
        assert w.load_weights(fs.receive(path))["version"] == 6
        assert e2e.hf_logprob_diff(tiny_model_dir, served()) < 1e-4
        assert w.store.versions == [] and list(w.store.root.iterdir()) == []  # no directory written
    finally:
        w.close()
