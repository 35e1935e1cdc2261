"""``rollout.agent`` in the streaming pipeline (issue 43 item 6): ``rollout.streaming: true`` with
``trainer.max_staleness: 1``, through the driver (local Ray, vLLM's async engine, DeepSpeed
learner), on the byte-level BPE tiny model with a ChatML template (tests/bpe_model.py).

The agent (tests/agent_helpers.py ``rewriting``: two calls, then a rewritten history: two
segments) runs on the endpoint as in the batch pipeline; each of its requests is one request of
the async engine. Checked: both steps train, every trajectory's two segments reach the batch
(``rollout/agent_segments``), no agent failed, and no sample is more than one version behind the
learner.
"""

from __future__ import annotations

from pathlib import Path

import e2e
import pytest

from bpe_model import make_bpe_model

pytestmark = pytest.mark.slow
HELPERS = Path(__file__).parent / "agent_helpers.py"


def test_an_agent_trains_in_the_streaming_pipeline_with_staleness(ray_cluster, tmp_path):
    model = make_bpe_model(tmp_path / "model")
    rec = e2e.Recorder()
    cfg = e2e.config(model, tmp_path / "run", steps=2,
                     model={"path": str(model), "make_if_missing": None, "max_model_len": 512},
                     data={"chat_template": False},
                     rollout={"backend": "vllm", "streaming": True, "max_tokens": 6, "max_turns": 4,
                              "agent": f"{HELPERS}:rewriting"},
                     trainer={"steps": 2, "seed": 0, "eval_before_after": False, "max_staleness": 1})
    t, _ = e2e.train_run(cfg, rec)
    assert [h["sync/version"] for h in t.history] == [1.0, 2.0]
    for h in t.history:  # 4 prompts x 4 trajectories, each 2 segments: 16 more samples per step
        assert h["rollout/agent_segments"] == 16.0 and h["rollout/agent_segments_mean"] == 2.0
        assert h.get("rollout/stop_reason/env_error", 0.0) == 0.0  # every agent ran to its end
    for s in rec.steps:
        assert len(s["versions"]) == 32
        assert all(0 <= s["learner_version"] - v <= 1 for v in s["versions"]), (s["learner_version"], s["versions"])
    print(f"versions per step: {[sorted(set(s['versions'])) for s in rec.steps]}; "
          f"staleness max: {[h['rollout/staleness_max'] for h in t.history]}")
