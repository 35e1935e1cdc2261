"""``rollout.agent``: agents written against the OpenAI API (tests/agent_helpers.py, the openai
package as the real client) against a real engine (vLLM in-process, a seeded tiny Llama over a
byte-level BPE vocabulary with a ChatML template: tests/bpe_model.py), one engine for the module:

* a tool-calling loop trains on the engine's exact sampled ids and behaviour log-probs (mask 1),
  the agent's tool / user messages are the template's tokens (mask 0), call k of a trajectory
  samples with its own seed (runs repeat), the agent's return is ``env_reward``; while its agents
  are live, a second OS process that knows the port tries every route with guessed trajectory ids
  (tests/agent_attacker.py): every attempt gets the one 404, and none of its text is trained on;
* a rewritten history starts a new segment, trained as a sample of its own with the trajectory's
  advantage (``rollout/agent_segments``);
* ``/v1/completions`` (text and token-id prompts) and ``/v1/models``;
* bad requests get OpenAI-style 4xx errors with a reason (other sampling values, a tool choice not among the tools, n, a
  bad role or content, max_tokens 0) and the trajectory goes on; a hung agent is cut at
  ``rollout.trajectory_timeout_s``, one that raises ends as ``env_error``;
* an engine call that raises fails the worker's call with its error (issue 42);
* the config refuses ``rollout.agent`` with an environment (and takes it with streaming), and
  pre-flight names a missing function.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from agent_attacker import NEVER, not_refused
from bpe_model import make_bpe_model
from grpo_dist.config import AlgoConfig, ConfigError, load_config
from grpo_dist.data import make_task
from grpo_dist.envs.chat import MessageEncoder
from grpo_dist.rollout.agent import AgentRollouts
from grpo_dist.types import RewardResult

HELPERS = Path(__file__).parent / "agent_helpers.py"
ATTACKER = Path(__file__).parent / "agent_attacker.py"
PAYLOAD = "INJECTED-BY-ANOTHER-PROCESS"


def test_config_refuses_an_agent_with_an_environment_and_takes_it_streaming():
    with pytest.raises(ConfigError, match="rollout.agent replaces the environment"):
        load_config(None, {"rollout": {"agent": f"{HELPERS}:chat_loop", "env": "calculator"}})
    streaming = load_config(None, {"rollout": {"agent": f"{HELPERS}:chat_loop", "streaming": True, "backend": "vllm"},
                                   "trainer": {"max_staleness": 1}})  # tests/test_agent_stream.py runs it
    assert streaming.rollout.streaming and streaming.trainer.max_staleness == 1
    with pytest.raises(ConfigError, match="rollout.agent_kwargs without rollout.agent"):
        load_config(None, {"rollout": {"agent_kwargs": {"x": 1}}})


def test_preflight_names_a_missing_agent(tiny_model_dir):
    from grpo_dist.run import preflight

    with pytest.raises(ConfigError, match=r"rollout.agent: agent .*has no attribute 'nope'"):
        preflight.check(load_config(None, {"model": {"path": str(tiny_model_dir)}, "data": {"eval_path": None},
                                           "rollout": {"agent": f"{HELPERS}:nope"}}))


@pytest.fixture(scope="module")
def worker(tmp_path_factory):
    from grpo_dist.rollout.worker import RolloutWorker

    model = make_bpe_model(tmp_path_factory.mktemp("bpe") / "model")
    cfg = load_config(None, {"model": {"path": str(model), "max_model_len": 1024}, "lora": {"enabled": False},
                             "rollout": {"backend": "vllm", "group_size": 2, "max_tokens": 8, "max_turns": 4,
                                         "agent": f"{HELPERS}:chat_loop"}})
    w = RolloutWorker(cfg)
    w.setup()
    calls: list = []
    generate = w.engine.generate

    def spy(prompts, spec, seeds=None):  # the real engine; what it was asked and what it sampled, recorded
        out = generate(prompts, spec, seeds)
        calls.extend((list(p), list(s.token_ids), list(s.logprobs), sd) for p, (s,), sd in
                     zip(prompts, out, seeds or [None] * len(prompts)))
        return out

    w.engine.generate = spy
    w.calls = calls
    yield w
    w.close()


def _run(w, agent: str, n: int = 2, seed: int = 1, **rollout):
    w.agent.close()
    w.agent = AgentRollouts(w.cfg.rollout.model_copy(update={"agent": f"{HELPERS}:{agent}", **rollout}),
                            Path(str(w.cfg.model.path)).name)
    w.calls.clear()
    recs = make_task("add", n, seed=5, split="eval")
    groups = w.generate(recs, keys=[(seed, 1, i) for i in range(n)])
    return [r for g in groups for r in g.rollouts]


def _runs(mask: list[int]) -> list[tuple[int, int]]:
    """(start, end) of each run of 1s."""
    out, start = [], None
    for i, m in enumerate(mask + [0]):
        if m == 1 and start is None:
            start = i
        elif m == 0 and start is not None:
            out.append((start, i))
            start = None
    return out


def _attack_when_live(hold: Path, out: dict) -> threading.Thread:
    """Another OS process (tests/agent_attacker.py: stdlib, no secret) tries every route of the
    endpoint with guessed ids while the agents wait between their first and second call; then
    they go on."""
    def attack():
        try:
            port_file, deadline = Path(f"{hold}.port"), time.monotonic() + 120
            while not port_file.exists() and time.monotonic() < deadline:
                time.sleep(0.05)
            p = subprocess.run([sys.executable, str(ATTACKER), port_file.read_text(), PAYLOAD], capture_output=True,
                               text=True, timeout=300)
            out["attempts"] = json.loads(p.stdout)
        finally:
            hold.touch()

    t = threading.Thread(target=attack, daemon=True)
    t.start()
    return t


@pytest.mark.slow
def test_a_tool_loop_trains_the_sampled_tokens(worker, tmp_path):
    log, attacked = tmp_path / "log.jsonl", {}
    attacker = _attack_when_live(tmp_path / "hold", attacked)
    rollouts = _run(worker, "chat_loop", agent_kwargs={"log": str(log), "turns": 3, "hold": str(tmp_path / "hold")})
    attacker.join()
    assert len(attacked["attempts"]) > 700
    never = next(a for a in attacked["attempts"] if a[1] == f"/t/{NEVER}/v1/models")
    assert never[2] == 404 and not_refused(attacked["attempts"], never) == []  # every guess: one 404
    tok, enc = worker.engine.tokenizer, MessageEncoder(worker.engine.tokenizer)
    sampled: dict[tuple, list] = {}  # context -> what the engine sampled for it (a group's trajectories share one)
    for p, ids, lps, seed in worker.calls:
        sampled.setdefault(tuple(p), []).append((ids, lps, seed))
    assert len(worker.calls) == 3 * len(rollouts)
    for r in rollouts:
        assert (r.turns, r.columns["env_reward"], r.columns["agent_segments"], r.segments) == (3, 3.0, 1, None)
        assert r.stop_reason in ("done", "length")  # length: the last call used its 8 tokens
        built = r.prompt_ids + r.completion_ids
        runs = _runs([0] * len(r.prompt_ids) + r.loss_mask)
        assert len(runs) == 3
        seeds = []
        for k, (a, b) in enumerate(runs):  # each turn: the engine's ids and log-probs for exactly this context
            ids, lps, seed = next(x for x in sampled[tuple(built[:a])] if x[0] == built[a:b])
            assert r.logprobs[a - len(r.prompt_ids):b - len(r.prompt_ids)] == lps
            seeds.append(seed)
            if k < 2:  # between turns: exactly the template's tokens of what the agent sent (mask 0)
                nxt, last = runs[k + 1][0], built[b - 1]
                glue = built[b:nxt]
                replies = [[{"role": "tool", "content": "42"}] * c for c in (1, 2, 3)]
                assert glue in [enc(m, last) for m in replies + [[{"role": "user", "content": f"Again ({k})."}]]]
                assert tok.decode(glue).endswith("<|im_start|>assistant\n")
        assert len(set(map(str, seeds))) == 3  # each call its own seed
        text = tok.decode(r.prompt_ids)
        assert "You add." in text and '"name": "add"' in text  # the tools stated in the system prompt
    seen = [json.loads(x) for x in log.read_text().splitlines()]
    assert len(seen) == len(rollouts) and all(len(s["turns"]) == 3 for s in seen)
    starts = sorted(a for r in rollouts for a, _ in _runs([0] * len(r.prompt_ids) + r.loss_mask))
    assert sorted(t["usage"]["prompt_tokens"] for s in seen for t in s["turns"]) == starts  # usage: each call's context
    assert all(PAYLOAD not in tok.decode(r.prompt_ids + r.completion_ids) for r in rollouts)  # none of it trained
    again = _run(worker, "chat_loop", agent_kwargs={"turns": 3})  # the same keys: the same tokens
    assert [x.completion_ids for x in again] == [x.completion_ids for x in rollouts]


@pytest.mark.slow
def test_a_rewritten_history_is_a_segment_of_its_own(worker):
    from grpo_dist.batch import build_batch

    rollouts = _run(worker, "rewriting")
    for r in rollouts:
        assert r.columns["agent_segments"] == 2 and len(r.segments) == 1 and r.turns == 3
        first, last = r.segments[0], r
        assert first.turns == 2 and sum(first.loss_mask) > 0 and "Summary:" in worker.engine.tokenizer.decode(
            last.prompt_ids)
        assert "Summary:" not in worker.engine.tokenizer.decode(first.prompt_ids + first.completion_ids)
    scores = RewardResult(total=[float(i) for i in range(len(rollouts))], per_function={})
    batch, metrics = build_batch([_group(rollouts)], scores, len(rollouts), AlgoConfig(), 64)
    n = len(rollouts)
    assert len(batch) == 2 * n and metrics["rollout/agent_segments"] == n
    assert batch.advantages[n:] == batch.advantages[:n]  # each segment with its trajectory's advantage
    assert batch.prompt_ids[n:] == [r.segments[0].prompt_ids for r in rollouts]
    assert batch.loss_mask[n] == [float(x) for x in rollouts[0].segments[0].loss_mask]


def _group(rollouts):
    from grpo_dist.types import RolloutGroup

    return RolloutGroup(prompt_id=0, rollouts=rollouts)


@pytest.mark.slow
def test_completions_and_models(worker, tmp_path):
    log = tmp_path / "log.jsonl"
    rollouts = _run(worker, "completions", agent_kwargs={"log": str(log)})
    seen = [json.loads(x) for x in log.read_text().splitlines()]
    assert {s["model"] for s in seen} == {"model"}  # the model directory's name
    for r in rollouts:
        assert (r.turns, r.columns["agent_segments"], r.columns["env_reward"]) == (2, 1, 1.0)
        (a, b), (c, d) = _runs(r.loss_mask)
        assert r.completion_ids[b:c] == [5, 6, 7] and r.loss_mask[b:c] == [0, 0, 0]  # the agent's ids, masked
        assert (r.prompt_ids + r.completion_ids[:c]) in [s["ids"] for s in seen]


@pytest.mark.slow
def test_bad_requests_get_openai_errors_and_the_trajectory_goes_on(worker, tmp_path):
    log = tmp_path / "log.jsonl"
    rollouts = _run(worker, "bad_requests", agent_kwargs={"log": str(log)})
    seen = [json.loads(x) for x in log.read_text().splitlines()]
    errors = seen[0]["errors"]
    assert errors.pop("embeddings")[0] == 404
    assert all(v is not None and v[0] == 400 for v in errors.values()), errors
    assert "rollout.temperature 1.0" in errors["temperature"][1] and "rollout.top_p" in errors["top_p"][1]
    assert "n must be 1" in errors["n"][1] and "'nope', which is not among the tools" in errors["tool_choice"][1]
    assert "role must be one of" in errors["role"][1] and "image_url" in errors["image"][1]
    assert "max_tokens must be a positive integer" in errors["max_tokens"][1]
    assert all(r.turns == 1 and r.columns["env_reward"] == 0.5 and sum(r.loss_mask) == 3 for r in rollouts)


@pytest.mark.slow
def test_a_hung_agent_is_cut_and_a_raising_one_ends_its_trajectory(worker):
    import time

    t0 = time.monotonic()
    rollouts = _run(worker, "async_hang", trajectory_timeout_s=3.0)
    assert time.monotonic() - t0 < 20
    assert all(r.stop_reason == "timeout" and r.turns == 1 and r.truncated for r in rollouts)
    assert all(sum(r.loss_mask) == len(r.completion_ids) > 0 for r in rollouts)  # its one call is kept
    rollouts = _run(worker, "raises")
    assert all(r.stop_reason == "env_error" and r.completion_ids == [] for r in rollouts)
    assert all(r.error == "agent: RuntimeError: the agent broke" for r in rollouts)  # named if the run stops


@pytest.mark.slow
def test_an_engine_error_fails_the_call_with_it_not_the_agents(worker):
    """Issue 42 item 2: the first batched engine call raises (vLLM's CPU attention check did): the
    agents get a 500, the worker's call fails at once with the engine's error (before, every
    trajectory ended as env_error and the run trained on them); the engine is not called again
    in that call, and the next call generates."""
    import time

    from grpo_dist.testing.rollout import EngineCallFailed, fail_engine_calls

    spy = worker.engine.generate
    fail_engine_calls(worker)
    try:
        t0 = time.monotonic()
        with pytest.raises(EngineCallFailed, match=r"^Check failed: thread_num == thread_num"):
            _run(worker, "retrying")
        assert time.monotonic() - t0 < 30 and worker.engine.failed_calls == 1 and worker.calls == []
        again = _run(worker, "retrying")
        assert len(again) == 4 and all(r.stop_reason != "env_error" and r.turns == 2 for r in again), again
    finally:
        worker.engine.generate = spy


@pytest.mark.slow
def test_max_tokens_is_honoured_within_the_trajectory_budget(worker, tmp_path):
    log = tmp_path / "log.jsonl"
    rollouts = _run(worker, "over_budget", max_total_tokens=10, agent_kwargs={"log": str(log)})
    for s in (json.loads(x) for x in log.read_text().splitlines()):
        assert s["first"][0] <= 10 and (s["first"][1] == "length") == (s["first"][0] == 10)  # 100 asked, 10 left
        if s["first"][0] == 10:  # the whole budget sampled: the next call is refused, saying why
            assert s["second"][0] == 400 and "sampled its 10 tokens" in s["second"][1]
    assert all(r.stop_reason == "budget" and sum(r.loss_mask) <= 10 for r in rollouts if sum(r.loss_mask) == 10)
