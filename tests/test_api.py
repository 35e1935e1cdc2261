"""The Python API as TRL users write it (issue 55.1): ``GRPOTrainer(model=..., reward_funcs=[...],
args=GRPOConfig(...), train_dataset=..., eval_dataset=..., peft_config=LoraConfig(...)).train()``.

TRL's option names map onto the config (no actor started), a bad option is one line naming it
before anything starts, and a real run on CPU takes an in-memory ``datasets.Dataset`` (training),
a list of dicts (held-out) and Python callables defined here -- a closure, an object with
``__call__``, a lambda -- which reach the reward actors (other processes, which cannot import this
module) by value; the summary ``train()`` returns is ``summary.json``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import e2e
from grpo_dist import GRPOConfig, GRPOTrainer
from grpo_dist.config import ConfigError, dump_config
from grpo_dist.util.callables import CallableSpec

ROOT = Path(__file__).resolve().parents[1]


def counting_reward(calls_file: Path):
    """TRL's signature: the answer column by name, the others (prompts, a, b, ...) in kwargs; each
    call appends who ran it and what it got to ``calls_file``."""
    def right_answer(completions, answer, **kwargs):
        with open(calls_file, "a") as f:
            f.write(json.dumps({"pid": os.getpid(), "n": len(completions), "kwargs": sorted(kwargs)}) + "\n")
        return [1.0 if c.strip() == a else 0.0 for c, a in zip(completions, answer)]
    return right_answer


class Quarter:
    """A callable object: the same reward for every completion (reward/Quarter is 0.25 each step)."""

    def __call__(self, prompts, completions, **kwargs):
        return [0.25] * len(completions)


def add_rows(n: int, split: str = "train") -> list[dict]:
    from grpo_dist.data.synthetic import make_task

    return [r.as_example() for r in make_task("add", n, seed=0, split=split)]


def short_args(out: Path, **more) -> GRPOConfig:
    """The demo config as TRL options and a few project keys: hf engine, 4 prompts x 4 of 5 tokens."""
    rollout = {"backend": "hf", "num_workers": 1, "prompts_per_step": 4, **more.pop("rollout", {})}
    options = dict(num_generations=4, max_completion_length=5, max_steps=2, learning_rate=1e-3,
                   per_device_train_batch_size=8, report_to="none", seed=0, rollout=rollout,
                   **{"checkpoint.every": 0, "logging.progress": False, "eval.samples_per_prompt": 1,
                      "eval.pass_k": [1]})
    return GRPOConfig(output_dir=str(out), config=e2e.DEMO, **{**options, **more})


def test_trl_option_names_map_onto_the_config(tmp_path):
    args = GRPOConfig(output_dir=str(tmp_path), num_generations=4, max_completion_length=7, learning_rate=3e-4,
                      max_steps=3, per_device_train_batch_size=8, beta=0.0, epsilon=0.3, loss_type="dr_grpo",
                      scale_rewards=False, temperature=0.7, seed=5, report_to="none", use_vllm=False,
                      generation_batch_size=16, adam_beta2=0.95, max_grad_norm=0.5, warmup_steps=2,
                      **{"rollout.num_workers": 1}, reward={"num_workers": 2})
    c = args.config
    got = (c.output_dir, c.rollout.group_size, c.rollout.max_tokens, c.learner.lr, c.trainer.steps,
           c.learner.micro_batch_size, c.algo.beta, c.algo.clip_low, c.algo.clip_high, c.algo.agg, c.algo.adv_scale,
           c.rollout.temperature, c.trainer.seed, c.logging.wandb_mode, c.rollout.backend, c.rollout.prompts_per_step,
           tuple(c.learner.betas), c.learner.grad_clip, c.learner.warmup_steps, c.rollout.num_workers,
           c.reward.num_workers)
    assert got == (str(tmp_path), 4, 7, 3e-4, 3, 8, 0.0, 0.3, 0.3, "seq-mean-token-sum-norm", "none", 0.7, 5,
                   "disabled", "hf", 4, (0.9, 0.95), 0.5, 2, 1, 2)  # 16 completions / 4 = 4 prompts a step
    assert (args.learning_rate, args.num_generations, args.rollout.num_workers) == (3e-4, 4, 1)  # read as TRL's
    over = GRPOConfig(config=e2e.DEMO, overrides=["--trainer.steps", "7"], epsilon=0.1, epsilon_high=0.28,
                      loss_type="dapo", scale_rewards="batch", report_to=["wandb"]).config
    assert (over.trainer.steps, over.algo.clip_low, over.algo.clip_high, over.algo.agg, over.algo.adv_scale,
            over.logging.wandb_mode, over.rollout.group_size) == (7, 0.1, 0.28, "token-mean", "batch", "online", 8)

    from peft import LoraConfig

    calls = tmp_path / "calls.jsonl"
    trainer = GRPOTrainer(model=str(tmp_path / "m"), reward_funcs=[counting_reward(calls), "correctness"],
                          args=GRPOConfig(output_dir=str(tmp_path / "out"), reward_weights=[2.0, 0.5]),
                          train_dataset=add_rows(6), peft_config=LoraConfig(r=4, lora_alpha=8, lora_dropout=0.1,
                                                                            target_modules=["q_proj", "v_proj"]))
    c = trainer.config
    assert (c.model.path, c.lora.r, c.lora.alpha, c.lora.dropout, c.lora.target_modules) == (
        str(tmp_path / "m"), 4, 8.0, 0.1, ["q_proj", "v_proj"])
    fns = c.reward.functions
    assert isinstance(fns[0].fn, CallableSpec) and fns[0].fn.fn.__name__ == "right_answer"
    assert (fns[1].fn, [f.weight for f in fns]) == ("correctness", [2.0, 0.5])
    path = Path(c.data.path)
    assert path.parent == tmp_path / "out" / "datasets" and path.suffix == ".jsonl" and c.data.eval_path is None
    assert not path.exists() and not calls.exists()  # written when train() starts; nothing called yet
    dumped = yaml.safe_load(dump_config(c))  # config.yaml: valid YAML, the callable by its name and hash
    assert dumped["reward"]["functions"][0]["fn"].startswith(f"<callable {__name__}.counting_reward.<locals>"
                                                             f".right_answer #")


def test_the_python_snippets_of_the_readme_and_the_docs_build_their_trainers(tmp_path, monkeypatch):
    """Every ```python block that imports grpo_dist (the README's quick start, docs/python-api.md's
    side of the side-by-side) runs as written up to ``train()``: its options are a valid config."""
    import re

    monkeypatch.chdir(tmp_path)  # their relative output_dir
    made = []
    monkeypatch.setattr(GRPOTrainer, "train", lambda self, **kw: made.append(self) or {})
    blocks = [b for page in ("README.md", "docs/python-api.md")
              for b in re.findall(r"^```python\n(.*?)^```", (ROOT / page).read_text(), flags=re.M | re.S)
              if "from grpo_dist import" in b]
    assert len(blocks) == 2
    for code in blocks:
        exec(compile(code, "<snippet>", "exec"), {"__name__": "snippet"})
    assert [(t.config.rollout.group_size, t.config.trainer.steps, t.config.data.eval_path is not None) for t in made] \
        == [(8, 60, True), (8, 60, True)]
    assert made[1].config.rollout.prompts_per_step == 8 and made[1].config.lora.r == 16  # generation_batch_size=64


def test_nothing_heavy_is_imported_to_build_a_trainer(tmp_path):
    code = ("import sys; from grpo_dist import GRPOTrainer, GRPOConfig; "
            f"GRPOTrainer(model='m', reward_funcs=[lambda completions, **kw: [0.0] * len(completions)], "
            f"args=GRPOConfig(output_dir={str(tmp_path)!r}, num_generations=4), "
            "train_dataset=[{'prompt': '1+1=', 'answer': '2'}] * 4); "
            "print(sorted(m for m in ('torch', 'ray', 'vllm', 'deepspeed', 'transformers') if m in sys.modules))")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.stdout.strip() == "[]", r.stderr[-2000:]


def test_a_bad_option_is_one_line_naming_it_before_anything_starts(pretrained_model_dir, tmp_path):
    cases = {
        "num_generation: unknown option": dict(num_generation=4),  # (a near miss: the name it meant)
        "num_generations (rollout.group_size): must be >= 2": dict(num_generations=1),
        "loss_type: 'grpoo' is not one of": dict(loss_type="grpoo"),
        "logging_steps: TRL's option has no counterpart here": dict(logging_steps=10),
        "learning_rate and learner.lr both set learner.lr": dict(learning_rate=1e-3, **{"learner.lr": 2e-3}),
        "rollout.group_sise: unknown key; did you mean rollout.group_size?": dict(rollout={"group_sise": 4}),
    }
    for want, options in cases.items():
        with pytest.raises(ConfigError) as e:
            GRPOConfig(**options)
        assert str(e.value).startswith(want) and "\n" not in str(e.value), (want, str(e.value))
    assert "did you mean num_generations (rollout.group_size)?" in str(_error(lambda: GRPOConfig(num_generation=4)))
    rows = add_rows(8)
    for want, make in {
        "train_dataset: row 1, column 'when': a object is not JSON": lambda: GRPOTrainer(
            args=GRPOConfig(output_dir=str(tmp_path)), train_dataset=[{"prompt": "1+1="}, {"prompt": "2+2=",
                                                                                          "when": object()}]),
        "peft_config.use_dora: True is not supported here": lambda: GRPOTrainer(
            args=GRPOConfig(output_dir=str(tmp_path)), peft_config=_lora(use_dora=True)),
        "reward_weights: 3 weights for 1 reward functions": lambda: GRPOTrainer(
            reward_funcs=[Quarter()], args=GRPOConfig(output_dir=str(tmp_path), reward_weights=[1, 1, 1])),
    }.items():
        err = str(_error(make))
        assert err.startswith(want) and "\n" not in err, err

    # the pre-flight of train(): a reward needing a column the dataset lacks; Ray never started
    def needs_solution(completions, solution, **kwargs):
        return [0.0] * len(completions)

    out = tmp_path / "run"
    trainer = GRPOTrainer(model=str(pretrained_model_dir), reward_funcs=needs_solution, args=short_args(out),
                          train_dataset=rows)
    with pytest.raises(ConfigError) as e:
        trainer.train()
    msg = str(e.value)
    assert msg.startswith("data.path: reward function 'needs_solution' needs column 'solution', missing in 8 of 8 "
                          "rows of ") and "\n" not in msg, msg
    assert sorted(p.name for p in out.iterdir()) == ["datasets"]  # no lock, no config.yaml, no actor
    ray = sys.modules.get("ray")
    assert ray is None or not ray.is_initialized()
    assert str(_error(lambda: GRPOConfig(config=str(tmp_path / "nope.yaml")))).startswith("config (--config):")


def _error(make) -> ConfigError:
    with pytest.raises(ConfigError) as e:
        make()
    return e.value


def _lora(**kw):
    from peft import LoraConfig

    return LoraConfig(r=4, **kw)


def test_adapters_and_callables_go_through_the_shared_pre_flight(pretrained_model_dir, tmp_path):
    """A GRPOConfig with ``adapters:`` takes the CLI's path too: each adapter's config checked (its
    own reward callable kept), the base's callable in every adapter, before any actor starts."""
    from grpo_dist.runner import check

    def brief(completions, **kwargs):
        return [-0.01 * len(c) for c in completions]

    adapters = [{"name": "quarter"}, {"name": "brief", "reward": {"functions": [{"fn": brief}]}}]
    trainer = GRPOTrainer(model=str(pretrained_model_dir), reward_funcs=[Quarter()], train_dataset=add_rows(8),
                          args=short_args(tmp_path / "run", adapters=adapters,
                                          rollout={"backend": "vllm", "num_workers": 1}))
    cfg, per_adapter = check(trainer.config, trainer._files)
    assert list(per_adapter) == ["quarter", "brief"]
    fns = {name: a.reward.functions[0].fn for name, a in per_adapter.items()}
    assert isinstance(fns["quarter"].fn, Quarter) and fns["brief"].fn is brief
    assert all(Path(a.data.path).is_file() for a in per_adapter.values())


@pytest.mark.slow
@pytest.mark.budget(300)
def test_a_real_run_through_the_api_with_in_memory_data_and_callables(pretrained_model_dir, tmp_path):
    from datasets import Dataset
    from peft import LoraConfig

    calls, out = tmp_path / "calls.jsonl", tmp_path / "run"
    trainer = GRPOTrainer(
        model=str(pretrained_model_dir),
        reward_funcs=[counting_reward(calls), Quarter(), lambda completions, **kw: [0.0] * len(completions)],
        args=short_args(out, reward_weights=[1.0, 1.0, 0.5]),
        train_dataset=Dataset.from_list(add_rows(16)), eval_dataset=add_rows(6, split="eval"),
        peft_config=LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"]))
    summary = trainer.train()

    assert summary == json.loads((out / "summary.json").read_text())  # the summary returned is summary.json
    assert summary["steps"] == 2 and Path(summary["adapter_dir"], "adapter_config.json").is_file()
    assert [p.name for p in (out / "checkpoints").iterdir()] == ["step_000002"] and not (out / "run.lock").exists()
    assert "sampled_accuracy_before" in summary and "sampled_accuracy_after" in summary  # the list of dicts evaluated
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [m["reward/Quarter"] for m in metrics] == [0.25, 0.25]  # the callable object, in the reward actor
    assert [m["reward/<lambda>"] for m in metrics] == [0.0, 0.0]
    assert all(0.0 <= m["reward/right_answer"] <= 1.0 for m in metrics)
    seen = [json.loads(line) for line in calls.read_text().splitlines()]
    assert {s["pid"] for s in seen} - {os.getpid()} == {s["pid"] for s in seen}  # only other processes called it
    assert sum(s["n"] for s in seen) >= 2 * 4 * 4  # two steps of 4 x 4 completions, and the evaluations
    assert {"prompts", "a", "b", "task"} <= set(seen[0]["kwargs"])  # TRL's call: the dataset's columns as kwargs
    cfg = yaml.safe_load((out / "config.yaml").read_text())
    assert [f["fn"].split(" #")[0] for f in cfg["reward"]["functions"]] == [
        f"<callable {__name__}.counting_reward.<locals>.right_answer", f"<callable {__name__}.Quarter instance",
        f"<callable {__name__}.test_a_real_run_through_the_api_with_in_memory_data_and_callables.<locals>.<lambda>"]
    assert Path(cfg["data"]["path"]).read_text().count("\n") == 16
    assert (cfg["lora"]["r"], cfg["rollout"]["group_size"], cfg["trainer"]["steps"]) == (8, 4, 2)
    ray = sys.modules.get("ray")
    assert ray is None or not ray.is_initialized()  # the run started Ray, the run shut it down


class CtrlCAfter:
    """A callback that presses Ctrl-C (SIGINT to this process) at the end of step ``step``."""

    def __init__(self, step: int):
        self.step = step

    def on_step(self, run, step, metrics, groups, batch):
        if step == self.step:
            import signal

            os.kill(os.getpid(), signal.SIGINT)


@pytest.mark.slow
@pytest.mark.budget(300)
def test_ctrl_c_saves_the_step_and_train_resumes_from_it(pretrained_model_dir, tmp_path):
    """Ctrl-C in ``train()`` (a notebook's interrupt) lets the step finish, saves it and raises
    ``Interrupted`` naming how to resume; ``train(resume_from_checkpoint=True)`` goes on from there."""
    from grpo_dist.run.run import Interrupted

    out = tmp_path / "run"
    trainer = GRPOTrainer(model=str(pretrained_model_dir), reward_funcs=[Quarter()], train_dataset=add_rows(16),
                          args=short_args(out, max_steps=3, trainer={"eval_before_after": False}),
                          callbacks=[CtrlCAfter(1)])
    with pytest.raises(Interrupted) as e:
        trainer.train()
    assert str(e.value) == (f"interrupted (SIGINT) at step 1 (checkpoint {out / 'checkpoints' / 'step_000001'}); "
                            f"resume with: the same GRPOTrainer(...).train() with GRPOConfig(resume_from_checkpoint=True)")
    trainer.callbacks = []
    summary = trainer.train(resume_from_checkpoint=True)
    assert (summary["steps"], summary["segments"]) == (3, 2)
    assert [m["step"] for m in map(json.loads, (out / "metrics.jsonl").read_text().splitlines())] == [1, 2, 3]
