"""Several adapters on one fleet, end to end through ``grpo-dist train`` (issue 53): a ``--sweep`` of
three learning rates on the tiny demo, each adapter's run equal to its single run; an ``adapters:``
config with two tasks and a broken reward, which stops alone, then resumed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
DEMO = REPO / "configs" / "tiny_cpu.yaml"
pytestmark = [pytest.mark.slow]

# short runs of the demo: one engine, 8 prompts x 8, two steps, 16 held-out prompts sampled once
SHORT = ["--rollout.num_workers", "1", "--rollout.prompts_per_step", "8", "--trainer.steps", "2",
         "--data.eval_size", "16", "--eval.samples_per_prompt", "1", "--eval.pass_k", "[1]",
         "--checkpoint.every", "0", "--logging.sample_table_every", "0", "--logging.progress", "true"]


def _train(model_dir, out, *args, config=DEMO, timeout=600) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "grpo_dist.cli", "train", "--config", str(config), "--model.path", str(model_dir),
           "--output_dir", str(out), *SHORT, *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=REPO,
                          env={**os.environ, "GRPO_DIST_EVAL_CACHE": "off"})


def _metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _adapter(run_dir: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(run_dir / "adapter" / "adapter_model.safetensors"))


@pytest.fixture(scope="module")
def sweep(pretrained_model_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("sweep")
    multi = _train(pretrained_model_dir, root / "sweep", "--sweep", "learner.lr=1e-3,3e-3,1e-2")
    single = _train(pretrained_model_dir, root / "single", "--learner.lr", "3e-3")
    return root, multi, single


@pytest.mark.budget(600)
def test_a_sweep_of_three_learning_rates_trains_three_adapters_each_as_its_single_run(sweep):
    root, multi, single = sweep
    assert multi.returncode == 0, multi.stdout[-3000:] + multi.stderr[-3000:]
    assert single.returncode == 0, single.stderr[-3000:]
    names = ["learner.lr=1e-3", "learner.lr=3e-3", "learner.lr=1e-2"]
    assert f"adapters  3 on one base: {', '.join(names)}" in multi.stdout
    assert multi.stdout.count("actors ready in") == 1  # one fleet, one start-up
    for name in names:
        assert f"[{name}] step 2/2" in multi.stdout
    table = multi.stdout[multi.stdout.index("=== grpo-dist adapters ==="):].splitlines()
    assert [row.split()[0] for row in table[2:5]] == names and all(row.split()[1] == "2" for row in table[2:5])
    top = json.loads((root / "sweep" / "summary.json").read_text())
    assert list(top["adapters"]) == names and top["failed"] == {}
    one = root / "single"
    for name in names:
        d = root / "sweep" / "adapters" / name
        s = json.loads((d / "summary.json").read_text())
        assert s.keys() == json.loads((one / "summary.json").read_text()).keys()  # the same keys as a single run's
        assert len(_metrics(d)) == 2 and (d / "adapter" / "adapter_config.json").is_file()
        assert yaml.safe_load((d / "config.yaml").read_text())["learner"]["lr"] == float(name.split("=")[1])
        assert list((d / "wandb").glob("offline-run-*")), name  # a W&B run of its own
    # the adapter at 3e-3 is its single run: the same samples, losses, weights and held-out result
    mine, alone = _metrics(root / "sweep" / "adapters" / names[1]), _metrics(one)
    for a, b in zip(mine, alone):
        for key in ("rollout/reward_mean", "train/loss", "train/grad_norm", "train/kl", "train/lr"):
            assert a[key] == b[key], key
    ta, tb = _adapter(root / "sweep" / "adapters" / names[1]), _adapter(one)
    assert ta.keys() == tb.keys() and all((ta[k] == tb[k]).all() for k in ta)
    s_mine = json.loads((root / "sweep" / "adapters" / names[1] / "summary.json").read_text())
    s_alone = json.loads((one / "summary.json").read_text())
    assert s_mine["sampled_accuracy_after"] == s_alone["sampled_accuracy_after"]
    # and the learning rates differ: the adapters did not train as one
    finals = [_metrics(root / "sweep" / "adapters" / n)[-1]["train/kl"] for n in names]
    assert len(set(finals)) == 3


def _write_plugin(path: Path) -> Path:
    path.write_text("def boom(prompts, completions, **kw):\n    raise RuntimeError('judge offline')\n")
    return path


@pytest.mark.budget(600)
def test_an_adapters_config_with_two_tasks_a_broken_reward_that_stops_alone_and_a_resume(pretrained_model_dir,
                                                                                         tmp_path):
    plugin = _write_plugin(tmp_path / "broken_reward.py")
    cfg = yaml.safe_load(DEMO.read_text())
    cfg["adapters"] = [
        {"name": "add", "trainer": {"seed": 1}},
        {"name": "broken", "reward": {"functions": [{"fn": f"{plugin}:boom"}]}},
        {"name": "small", "data": {"path": "builtin:add?max_operand=9", "eval_path": "builtin:add?max_operand=9"},
         "lora": {"r": 8, "alpha": 16}, "rollout": {"group_size": 4}},
    ]
    config = tmp_path / "two_tasks.yaml"
    config.write_text(yaml.safe_dump(cfg))
    out = tmp_path / "run"
    first = _train(pretrained_model_dir, out, "--checkpoint.every", "1", config=config)
    assert first.returncode == 1, first.stdout[-3000:] + first.stderr[-3000:]
    assert "adapter broken stopped: reward function 'boom' failed on all 16 completions" in first.stdout
    assert "adapter(s) broken stopped before the end" in first.stderr
    top = json.loads((out / "summary.json").read_text())
    assert list(top["adapters"]) == ["add", "small"] and list(top["failed"]) == ["broken"]
    small = yaml.safe_load((out / "adapters" / "small" / "config.yaml").read_text())
    assert small["lora"]["r"] == 8 and small["rollout"]["group_size"] == 4 and "max_operand=9" in small["data"]["path"]
    for name in ("add", "small"):
        assert (out / "adapters" / name / "checkpoints" / "step_000002").is_dir()
    # resume: every adapter continues from its own newest checkpoint
    # (and one step ahead: each adapter's batches generate while its learner trains, at most 1 version old)
    again = _train(pretrained_model_dir, out, "--checkpoint.resume", "auto", "--trainer.steps", "4",
                   "--checkpoint.every", "1", "--trainer.max_staleness", "1", config=config)
    assert again.returncode == 1, again.stderr[-3000:]  # broken is still broken
    assert again.stdout.count("resumed from step 2") == 2
    for name in ("add", "small"):
        m = _metrics(out / "adapters" / name)
        assert [int(x["step"]) for x in m] == [1, 2, 3, 4], name
        assert m[3]["rollout/staleness_max"] == 1 and m[3]["timing/generate_wait"] < m[0]["timing/generate"], name


@pytest.mark.heavy
@pytest.mark.budget(1800)
def test_two_tasks_as_adapters_on_smollm2(smollm2_dir, tmp_path):
    """The done-run on the real model (heavy tier; the tiny-model tests above cover each item in
    `make test`): SmolLM2's word-problem recipe with two adapters, the recipe's task and an easier
    one, two steps each, evaluated before and after."""
    from grpo_dist.models.gguf_source import cache_root

    cfg = yaml.safe_load((REPO / "configs" / "smollm2_cpu.yaml").read_text())
    cfg["adapters"] = [{"name": "word-problems"},
                       {"name": "easy", "data": {"path": "builtin:word_problems?difficulty=1&instruction=varied"},
                        "learner": {"lr": 1e-4}}]
    config = tmp_path / "two_tasks.yaml"
    config.write_text(yaml.safe_dump(cfg))
    out = tmp_path / "run"
    env = dict(os.environ, GRPO_DIST_CACHE=str(cache_root()), HF_HUB_OFFLINE="1", GRPO_DIST_EVAL_CACHE="off")
    cmd = [sys.executable, "-m", "grpo_dist.cli", "train", "--config", str(config), "--trainer.steps", "2",
           "--rollout.prompts_per_step", "4", "--rollout.max_tokens", "96", "--data.eval_size", "32",
           "--eval.samples_per_prompt", "1", "--eval.pass_k", "[1]", "--eval.extra", "{}",
           "--checkpoint.every", "0", "--logging.sample_table_every", "0", "--output_dir", str(out)]
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=1700)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    top = json.loads((out / "summary.json").read_text())
    assert list(top["adapters"]) == ["word-problems", "easy"]
    for name, s in top["adapters"].items():
        assert s["steps"] == 2 and s.get("sampled_accuracy_after") is not None, name
    print(proc.stdout[proc.stdout.index("=== grpo-dist adapters ==="):])
