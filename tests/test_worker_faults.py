"""A rollout worker's weight load that fails half way (fault injected into a real worker on the
transformers backend): the engine it put to sleep is woken whole again."""

from __future__ import annotations

import pytest

from grpo_dist.config import load_config
from grpo_dist.rollout.worker import RolloutWorker
from grpo_dist.types import AdapterUpdate


def test_a_failed_load_still_wakes_the_kv_cache(tiny_model_dir):
    cfg = load_config(None, {"model": {"path": str(tiny_model_dir)}, "lora": {"enabled": False},
                             "rollout": {"backend": "hf", "group_size": 2, "max_tokens": 4}})
    w = RolloutWorker(cfg)
    w.setup()
    woken: list[list[str]] = []
    try:
        # colocated on GPU the engine sleeps while the learner trains (the hf engine has no sleep mode:
        # its wake-up is recorded here); the reload then fails
        w._asleep, w.engine.wake_up = True, woken.append

        def broken(path):
            raise OSError("disk full")

        w.engine.load_full_weights = broken
        update = AdapterUpdate(1, {k: v.clone() for k, v in list(w.engine.model.state_dict().items())[:1]}, None)
        with pytest.raises(OSError, match="disk full"):
            w.load_weights(update)
        assert woken == [["weights"], ["kv_cache"]] and w.version == 0
    finally:
        w.close()
