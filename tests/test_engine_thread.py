"""The in-process vLLM CPU engine belongs to one thread (``grpo_dist/util/owner_thread.py``):
whichever thread calls it, it runs on the thread that built it.

Without that, an agent's first engine call (made from the agent endpoint's worker thread, not
the actor's) failed vLLM's CPU attention check ``input->metadata->thread_num == thread_num (1 vs.
2)`` whenever that first batch was small, and the engine hung after it: a Ray actor of fewer
than 2 CPUs gets ``OMP_NUM_THREADS=1``, so a fresh thread plans attention with 1 OpenMP thread
until torch's first parallel op gives it the engine's 2 (issue 43, item 1).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from grpo_dist.util.owner_thread import OwnerThread

HELPERS = Path(__file__).parent / "agent_helpers.py"


def test_owner_thread_runs_each_call_on_its_thread_and_raises_its_errors_here():
    owner = OwnerThread("owner-test")
    try:
        names = [owner.call(lambda: threading.current_thread().name) for _ in range(2)]
        assert names == ["owner-test", "owner-test"]
        nested = owner.call(lambda: owner.call(lambda: threading.current_thread().name))  # from itself: directly
        assert nested == "owner-test"
        from_elsewhere: list = []
        t = threading.Thread(target=lambda: from_elsewhere.append(owner.call(lambda: threading.current_thread().name)))
        t.start()
        t.join(10)
        assert from_elsewhere == ["owner-test"]
        with pytest.raises(ZeroDivisionError):
            owner.call(lambda: 1 / 0)
        assert owner.call(lambda: 7) == 7  # an error leaves the thread serving
    finally:
        owner.stop()
    with pytest.raises(RuntimeError, match="has stopped"):
        owner.call(lambda: 1)


PROBE = textwrap.dedent("""
    import json, sys

    def main():
        from grpo_dist.config import load_config
        from grpo_dist.data import make_task
        from grpo_dist.rollout.worker import RolloutWorker

        cfg = load_config(None, {"model": {"path": sys.argv[1], "max_model_len": 256}, "lora": {"enabled": False},
                                 "cluster": {"num_cpus": 2},
                                 "rollout": {"backend": "vllm", "group_size": 2, "max_tokens": 4,
                                             "trajectory_timeout_s": 60, "agent": sys.argv[2] + ":say_7"}})
        w = RolloutWorker(cfg)
        info = w.setup()  # as a rollout actor's: 2 torch threads, the engine bound to 2 CPUs
        groups = w.generate(make_task("add", 1, seed=5, split="eval"), keys=[(1, 1, 0)])
        rows = [[r.stop_reason, r.turns, len(r.completion_ids), r.columns.get("env_reward")]
                for g in groups for r in g.rollouts]
        print("ROLLOUTS " + json.dumps({"cpus": info["cpus"], "rows": rows}), flush=True)
        w.close()

    if __name__ == "__main__":
        main()
""")


@pytest.mark.slow
@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 CPUs: an engine of 2 OpenMP threads")
def test_an_agents_first_small_call_runs_on_an_engine_of_two_threads(tmp_path):
    """A Ray rollout actor's setting (``OMP_NUM_THREADS=1``, the engine bound to 2 CPUs), a
    one-line agent (one plain 'say 7' request): each trajectory's call is answered."""
    from bpe_model import make_bpe_model

    model = make_bpe_model(tmp_path / "model")
    script = tmp_path / "probe.py"
    script.write_text(PROBE)
    env = {k: v for k, v in os.environ.items() if k != "VLLM_CPU_OMP_THREADS_BIND"}
    env.update(OMP_NUM_THREADS="1", VLLM_CPU_KVCACHE_SPACE="1")
    p = subprocess.run([sys.executable, str(script), str(model), str(HELPERS)], capture_output=True, text=True,
                       env=env, timeout=300)
    line = [ln for ln in p.stdout.splitlines() if ln.startswith("ROLLOUTS ")]
    assert p.returncode == 0 and line, p.stdout[-2000:] + p.stderr[-4000:]
    out = json.loads(line[0][len("ROLLOUTS "):])
    assert len(out["cpus"].split(",")) >= 2, out  # the engine runs 2 or more OpenMP threads
    assert len(out["rows"]) == 2
    for stop, turns, n_ids, reward in out["rows"]:
        assert stop in ("done", "length") and turns == 1 and n_ids > 0 and reward == 1.0, (out, p.stderr[-3000:])


GROUP_PROBE = textwrap.dedent("""
    import json, sys, threading

    def main():
        from safetensors.torch import load_file

        from grpo_dist.config import load_config
        from grpo_dist.rollout.worker import RolloutWorker
        from grpo_dist.testing.rollout import receive_over_group

        cfg = load_config(None, {"model": {"path": sys.argv[1], "dtype": "float32"}, "lora": {"enabled": False},
                                 "cluster": {"num_cpus": 2},
                                 "rollout": {"backend": "vllm", "max_tokens": 4, "engine_in_process": True},
                                 "sync": {"transport": "collective", "timeout_s": 60}})
        w = RolloutWorker(cfg)
        w.setup()
        llm, seen = w.engine.llm, []
        for name in ("collective_rpc", "reset_prefix_cache"):  # the engine's side of the group's calls
            def recorded(*args, _fn=getattr(llm, name), _name=name, **kwargs):
                seen.append([_name, args[0] if args else None, threading.current_thread().name])
                return _fn(*args, **kwargs)
            setattr(llm, name, recorded)
        state = load_file(sys.argv[1] + "/model.safetensors")
        out, _, group = receive_over_group(w, state)  # joined from this (the actor's) thread
        print("GROUP " + json.dumps({"version": out["version"], "calls": seen}), flush=True)
        group.close()
        w.close()

    if __name__ == "__main__":
        main()
""")


@pytest.mark.slow
def test_the_weight_groups_engine_calls_run_on_the_engines_thread(tmp_path, tiny_model_dir):
    """Issue 52 item 5: ``sync.transport: collective`` joins the group and receives a version
    through ``collective_rpc`` (then resets the prefix cache); with the engine in the process each
    of those runs on the engine's own thread, not the actor's that asks (they once ran there)."""
    script = tmp_path / "group_probe.py"
    script.write_text(GROUP_PROBE)
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"}
    p = subprocess.run([sys.executable, str(script), str(tiny_model_dir)], capture_output=True, text=True,
                       env=env, timeout=300)
    line = [ln for ln in p.stdout.splitlines() if ln.startswith("GROUP ")]
    assert p.returncode == 0 and line, p.stdout[-2000:] + p.stderr[-4000:]
    out = json.loads(line[0][len("GROUP "):])
    assert out["version"] == 5
    assert [c[:2] for c in out["calls"]] == [["collective_rpc", "grpo_join_weight_group"],
                                             ["collective_rpc", "grpo_receive_weights"],
                                             ["reset_prefix_cache", None]], out
    assert {c[2] for c in out["calls"]} == {"vllm-engine"}, out
