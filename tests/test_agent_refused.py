"""Issue 52 item 5: an agent whose every request the endpoint refuses (a new user's smolagents
agent: its ~1,300-token system prompt in the calculator config's 1,024-token context) stops the run
at step 1 in one line, and that line carries the endpoint's own reason for the refused request and
the fix it names, not only the framework's wrapper (smolagents' ``AgentGenerationError: Error while
generating output:``, the SDK's error on the lines after it).

A real worker (transformers backend, the tiny BPE model of tests/bpe_model.py, ``model.max_model_len``
1024), agents of tests/agent_helpers.py through the openai SDK (and smolagents where installed);
the run's line is ``EnvErrorWatch``'s (grpo_dist/orchestrator/env_errors.py) fed the worker's groups,
as the driver feeds it. Nothing is sampled: every request is refused before the engine.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

from bpe_model import agent_worker
from grpo_dist.data import make_task
from grpo_dist.orchestrator.env_errors import EnvErrorRateError, EnvErrorWatch
from grpo_dist.rollout.agent import AgentRollouts

HELPERS = Path(__file__).parent / "agent_helpers.py"
# the endpoint's reason, and the fix: the context to raise (this prompt + the call's max_tokens)
REASON = (r"(\d+) prompt tokens leave no room in model\.max_model_len 1024: raise it past (\d+) \(this prompt \+ "
          r"max_tokens (\d+)\) or shorten the agent's messages")


@pytest.fixture(scope="module")
def worker(tmp_path_factory):
    with agent_worker(tmp_path_factory.mktemp("refused"), f"{HELPERS}:too_long", max_turns=4) as w:
        yield w


def _stop_line(w, agent: str, **kwargs) -> tuple[list, str]:
    """The worker's trajectories of ``agent`` (2 records x 2) and the line the run stops with."""
    r = w.cfg.rollout.model_copy(update={"agent": f"{HELPERS}:{agent}", "agent_kwargs": kwargs})
    w.agent.close()
    w.agent = AgentRollouts(r, "model")
    groups = w.generate(make_task("add", 2, seed=5, split="eval"), keys=[(1, 1, i) for i in range(2)])
    watch = EnvErrorWatch(r, 2)
    watch.observe(groups)
    with pytest.raises(EnvErrorRateError) as e:
        watch.end_step()
    return [r for g in groups for r in g.rollouts], str(e.value)


def _fix_is_right(m: re.Match, max_tokens: int = 8) -> None:
    prompt, past, asked = map(int, m.groups())
    assert prompt > 1024 and asked == max_tokens and past == prompt + max_tokens


def test_a_wrapped_refusal_stops_the_run_with_the_endpoints_reason(worker):
    rollouts, line = _stop_line(worker, "too_long")
    assert all(r.stop_reason == "env_error" and r.turns == 0 and r.completion_ids == [] for r in rollouts)
    m = re.fullmatch(r"rollout\.agent '.*:too_long' ended all 4 trajectories of the first step as env_error "
                     r"\(rollout\.max_env_error_rate 0\.5\); first error: agent: AgentGenerationError: Error while "
                     r"generating output: \[the endpoint refused its request \(400 context_length_exceeded\): "
                     + REASON + r"\]", line)
    assert m, line
    _fix_is_right(m)
    assert "\n" not in line


def test_the_sdks_own_error_already_names_it_and_is_kept_as_it_is(worker):
    rollouts, line = _stop_line(worker, "too_long", wrap=False)
    first = line.split("first error: ", 1)[1]
    assert first.startswith("agent: BadRequestError: Error code: 400 - ") and "the endpoint refused" not in first
    m = re.search(REASON, first)
    assert m, line
    _fix_is_right(m)


@pytest.mark.skipif(importlib.util.find_spec("smolagents") is None, reason="smolagents (the agents extra) is not "
                                                                          "installed")
def test_smolagents_as_a_new_user_writes_it(worker):
    rollouts, line = _stop_line(worker, "smolagents_plain")
    first = line.split("first error: ", 1)[1]
    m = re.fullmatch(r"agent: AgentGenerationError: Error while generating output: \[the endpoint refused its "
                     r"request \(400 context_length_exceeded\): " + REASON + r"\]", first)
    assert m, line
    prompt, past, asked = map(int, m.groups())
    assert prompt > 1024 and past == prompt + asked
