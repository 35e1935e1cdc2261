"""What goes wrong once the actors run, through the CLI as a user runs it (issue 22 A, B, C).

Each case runs ``python -m grpo_dist.cli train`` in a subprocess on the demo's base model with
tiny settings (transformers rollouts, one engine, 2 prompts x 4 completions a step) and checks
the exit code and the line; the exit code, the wall time and the line are printed (``pytest -s``)
for the "Failures after start" table of docs/errors.md.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow

BROKEN = '''
import asyncio, json, os

def count(prompts, completions, **kw):
    return [1.0] * (len(completions) - 1)

def strings(prompts, completions, **kw):
    return ["1.0" for _ in completions]

def nones(prompts, completions, **kw):
    return [None for _ in completions]

def boom(prompts, completions, **kw):
    raise RuntimeError("reward server down")

def flaky(prompts, completions, **kw):  # NaN for 3 of every 4 completions
    return [1.0 if i % 4 == 0 else float("nan") for i in range(len(completions))]

CALLS = []

def breaks_later(prompts, completions, **kw):  # fine on its first call, raises from the second on
    CALLS.append(1)
    if len(CALLS) > 1:
        raise ConnectionError("reward server went away")
    return [0.0] * len(completions)
'''

# A TRL-docs-style reward file: keyword arguments, conversational completions, the dataset's own
# column name, trainer_state, an async reward. Each call's view is appended to SEEN_FILE.
TRL_STYLE = '''
import asyncio, json, re

SEEN_FILE = {seen!r}

def format_reward_func(completions, **kwargs):
    """Reward function that checks if the completion has a specific format."""
    pattern = r"^<think>.*?</think><answer>.*?</answer>$"
    completion_contents = [completion[0]["content"] for completion in completions]
    matches = [re.match(pattern, content) for content in completion_contents]
    return [1.0 if match else 0.0 for match in matches]

def sum_reward(prompts, completions, completion_ids, solution, trainer_state, **kwargs):
    contents = [completion[0]["content"] for completion in completions]
    with open(SEEN_FILE, "a") as f:
        f.write(json.dumps({{"prompt": prompts[0], "completion": completions[0], "ids": completion_ids[0],
                            "solution": solution[0], "answer": kwargs.get("answer", [None])[0],
                            "step": trainer_state.global_step, "keys": sorted(kwargs)}}) + "\\n")
    return [1.0 if c.strip().startswith(s) else 0.0 for c, s in zip(contents, solution)]

async def brevity(completions, **kwargs):
    await asyncio.sleep(0.01)
    return [-0.01 * len(c[0]["content"]) for c in completions]
'''


def base_args(model_dir: Path, out: Path) -> list[str]:
    return ["--config", "configs/tiny_cpu.yaml", "--model.path", str(model_dir), "--model.make_if_missing", "null",
            "--output_dir", str(out), "--rollout.backend", "hf", "--rollout.num_workers", "1",
            "--rollout.prompts_per_step", "2", "--rollout.group_size", "4", "--trainer.eval_before_after", "false",
            "--checkpoint.every", "0", "--logging.wandb_mode", "disabled", "--logging.progress", "false"]


def train(*args: str, timeout: int = 600) -> tuple[subprocess.CompletedProcess, float]:
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "grpo_dist.cli", "train", *args], cwd=ROOT, capture_output=True,
                       text=True, timeout=timeout)
    return r, time.perf_counter() - t0


def error_line(r: subprocess.CompletedProcess) -> str:
    """The ``error:`` / ``config error:`` line the CLI printed last."""
    lines = [x for x in r.stderr.splitlines() if x.startswith(("error: ", "config error: "))]
    assert lines, r.stderr[-3000:]
    return lines[-1]


def report(case: str, r: subprocess.CompletedProcess, seconds: float, line: str) -> None:
    print(f"\nFAILURE-TABLE | {case} | {r.returncode} | {seconds:.0f} | {line}")


@pytest.fixture(scope="module")
def broken(tmp_path_factory) -> Path:
    p = tmp_path_factory.mktemp("plugins") / "broken.py"
    p.write_text(textwrap.dedent(BROKEN))
    return p


# make test runs the raising function through the CLI; the three kinds of bad values take the same
# path after the reward worker's check (tests/test_reward_failures.py checks each message): heavy
_VALUES = pytest.mark.heavy
FIRST_STEP = [
    pytest.param("wrong number of values", "count", "returned 7 values for 8 completions", marks=_VALUES,
                 id="wrong number of values"),
    pytest.param("strings", "strings", "returned non-numeric str for 8 of 8 completions", marks=_VALUES, id="strings"),
    pytest.param("all None", "nones", "returned None (not applicable) for all 8 completions", marks=_VALUES,
                 id="all None"),
    pytest.param("raises on every call", "boom", "RuntimeError: reward server down", id="raises on every call"),
]


@pytest.mark.parametrize("case, fn, why", FIRST_STEP)
def test_a_reward_broken_from_the_first_batch_stops_at_once(case, fn, why, broken, pretrained_model_dir, tmp_path):
    out = tmp_path / "run"
    r, s = train(*base_args(pretrained_model_dir, out), "--trainer.steps", "20",
                 "--reward.functions", f"[{{fn: correctness}}, {{fn: '{broken}:{fn}', weight: 0.1}}]")
    assert r.returncode == 1, r.stderr[-3000:]
    line = error_line(r)
    assert line == (f"error: step 1: reward function '{fn}' failed on all 8 completions of the first step: {why}; "
                    f"nothing was trained: fix the function and run again")
    assert not (out / "checkpoints").exists() and not (out / "summary.json").exists()
    if fn == "boom":  # the traceback follows the line
        tail = r.stderr[r.stderr.index(line):]
        assert "first failure of 'boom': RuntimeError: reward server down\nTraceback" in tail and "broken.py" in tail
    report(f"reward broken from the first batch: {case}", r, s, line)


def test_a_broken_reward_stops_at_the_evaluation_before_training(broken, pretrained_model_dir, tmp_path):
    r, s = train(*base_args(pretrained_model_dir, tmp_path / "run"), "--trainer.steps", "20",
                 "--trainer.eval_before_after", "true", "--data.eval_size", "4", "--eval.samples_per_prompt", "2",
                 "--eval.pass_k", "[1, 2]", "--eval.greedy", "false",
                 "--reward.functions", f"[{{fn: correctness}}, {{fn: '{broken}:count'}}]")
    assert r.returncode == 1, r.stderr[-3000:]
    line = error_line(r)
    assert line == ("error: reward function 'count' failed on all 8 completions of the evaluation before training: "
                    "returned 7 values for 8 completions; nothing was trained: fix the function and run again")
    report("reward broken, found by the evaluation before training", r, s, line)


def test_a_run_never_exits_0_when_a_reward_failed_past_the_limit(broken, pretrained_model_dir, tmp_path):
    """Shorter than reward.failure_window: the whole run is checked at the end. Also: resume auto
    into a fresh directory says it starts fresh."""
    out = tmp_path / "run"
    r, s = train(*base_args(pretrained_model_dir, out), "--trainer.steps", "2", "--checkpoint.resume", "auto",
                 "--reward.functions", f"[{{fn: correctness}}, {{fn: '{broken}:flaky', weight: 0.1}}]")
    assert f"no checkpoint in {out / 'checkpoints'}, starting fresh" in r.stdout + r.stderr
    assert r.returncode == 1, r.stderr[-3000:]
    line = error_line(r)
    assert line == (f"error: the run finished (2 steps, adapter in {out / 'adapter'}), but reward function 'flaky' "
                    f"failed on 12 of its 16 completions (75%) over the whole run (reward.max_failure_rate 0.5): see "
                    f"reward_failures in {out / 'summary.json'}")
    summary = json.loads((out / "summary.json").read_text())
    assert summary["reward_failures"]["flaky"] == {"scored": 16, "failed": 12, "rate": 0.75, "none": 0,
                                                   "first_failure": "returned nan for 6 of 8 completions"}
    assert summary["reward_failures"]["correctness"]["failed"] == 0 and (out / "adapter").is_dir()
    report("reward failing on 75% of its completions, run shorter than the window", r, s, line)


def test_an_environment_raising_on_every_trajectory_stops_the_run_naming_the_error(pretrained_model_dir, tmp_path):
    """Issue 42 item 2: not 20 steps trained on zeros and exit 0 (rollout.max_env_error_rate)."""
    out = tmp_path / "run"
    r, s = train(*base_args(pretrained_model_dir, out), "--trainer.steps", "20",
                 "--rollout.env", "grpo_dist.testing.envs:Raises", "--rollout.max_tokens", "4")
    assert r.returncode == 1, r.stderr[-3000:]
    line = error_line(r)
    assert line == ("error: step 1: the environment ('grpo_dist.testing.envs:Raises') ended all 8 trajectories of the "
                    "first step as env_error (rollout.max_env_error_rate 0.5); first error: Raises.step: "
                    "ConnectionError: tool server down (404); nothing was trained: fix it and run again")
    assert not (out / "checkpoints").exists() and not (out / "summary.json").exists()
    report("environment raising on every trajectory", r, s, line)


def test_a_reward_that_breaks_later_stops_with_a_checkpoint_and_a_changed_resume_is_refused(
        broken, pretrained_model_dir, tmp_path):
    out = tmp_path / "run"
    r, s = train(*base_args(pretrained_model_dir, out), "--trainer.steps", "20", "--reward.failure_window", "2",
                 "--reward.functions", f"[{{fn: correctness}}, {{fn: '{broken}:breaks_later', weight: 0.1}}]")
    assert r.returncode == 1, r.stderr[-3000:]
    err = r.stderr[r.stderr.index("error: step 3:"):]
    line = err.splitlines()[0]
    assert line.startswith("error: step 3: reward function 'breaks_later' failed on 100% of its 16 completions over "
                           "the last 2 steps (reward.max_failure_rate 0.5); stopped with a checkpoint of step 2 in ")
    assert "first failure of 'breaks_later': ConnectionError: reward server went away\nTraceback" in err
    ckpt = out / "checkpoints" / "step_000002"
    assert (ckpt / "trainer_state.json").is_file() and str(ckpt) in line
    report("reward that breaks at step 2 (window 2)", r, s, line)

    # C: a resume that changes what the checkpoint holds is refused before any actor starts, and
    # the run's config.yaml (which the printed resume command names) is left as it was.
    saved = (out / "config.yaml").read_text()
    r2, s2 = train("--config", str(out / "config.yaml"), "--checkpoint.resume", "auto", "--lora.r", "4",
                   "--lora.target_modules", "[q_proj, v_proj]", timeout=120)
    assert r2.returncode == 2, r2.stderr[-3000:]
    line2 = error_line(r2)
    assert line2 == (f"config error: checkpoint.resume: {ckpt} was trained with other lora.r (16, now 4), "
                     f"lora.target_modules ([q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj], "
                     f"now [q_proj, v_proj]); resume with the checkpoint's values or start a new output_dir")
    assert (out / "config.yaml").read_text() == saved and "Ray" not in r2.stderr
    report("resume with another lora.r and lora.target_modules", r2, s2, line2)


def test_trl_docs_style_rewards_run_unchanged_on_chat_prompts(pretrained_model_dir, tmp_path):
    seen = tmp_path / "seen.jsonl"
    plugin = tmp_path / "trl_rewards.py"
    plugin.write_text(textwrap.dedent(TRL_STYLE.format(seen=str(seen))))
    data = tmp_path / "chat.jsonl"
    rows = [{"prompt": [{"role": "user", "content": f"{a}+{b}="}], "solution": str(a + b), "level": a % 3}
            for a, b in [(12, 34), (5, 7), (40, 2), (3, 3), (21, 9), (8, 80)]]
    data.write_text("".join(json.dumps(x) + "\n" for x in rows))
    out = tmp_path / "run"
    r, s = train(*base_args(pretrained_model_dir, out), "--trainer.steps", "2", "--data.path", str(data),
                 "--data.eval_path", "null", "--data.chat_template", "true", "--data.answer_column", "solution",
                 "--reward.functions", f"[{{fn: '{plugin}:format_reward_func', weight: 0.5}}, "
                                       f"{{fn: '{plugin}:sum_reward'}}, {{fn: '{plugin}:brevity'}}]")
    assert r.returncode == 0, r.stderr[-3000:]
    calls = [json.loads(x) for x in seen.read_text().splitlines()]
    assert len(calls) == 2 and [c["step"] for c in calls] == [0, 1]  # trainer_state.global_step
    for c in calls:
        assert c["prompt"][-1]["role"] == "user" and c["prompt"][-1]["content"].endswith("=")
        assert c["completion"][0]["role"] == "assistant" and isinstance(c["completion"][0]["content"], str)
        assert isinstance(c["ids"], list) and c["ids"] and c["solution"] == c["answer"]
        assert c["keys"] == ["answer", "level"]
    summary = json.loads((out / "summary.json").read_text())
    assert {"reward/format_reward_func", "reward/sum_reward", "reward/brevity"} <= set(summary["final_metrics"])
    assert all(v["failed"] == 0 for v in summary["reward_failures"].values())
    report("TRL-docs-style rewards on chat prompts (not a failure)", r, s, "exit 0")
