"""Every shipped config runs (issue 55.4): no config under configs/ can rot unseen.

* Pre-flight (fast), each config as shipped through ``grpo_dist.run.preflight.check``. Its data is
  built in, or written by the command its header comment names, which docs/data.md gives too:
  that command runs here on real GSM8K rows (tests/test_prepare_gsm8k.py) in place of the Hub's. The
  model is the config's own where the tests have it (tiny_cpu's recipe: ``pretrained_model_dir``;
  SmolLM2's ``pkg:`` source: ``smollm2_dir``); one this machine cannot have offline (a Hub id, a GPU
  node's directory, which the header must say how to fetch) is replaced by a small stand-in
  (tests/bpe_model.py: byte-level BPE, a ChatML template, 2048 positions) so that every other
  check runs: the plug-ins resolve, the environments and agents load, the rewards find their
  columns, the prompts and openings fit (in the stand-in's tokens). W&B online needs a key and
  the server: offline here.
* One step (slow) of each on CPU: devices, scale and model swapped (tiny_cpu keeps its own model,
  the ``pretrained_model_dir`` recipe; the others get the stand-in), the hf rollout backend, the
  data as above; the algorithm, LoRA, learner options, rewards, environment or agent as shipped.
  One local Ray cluster serves every run (``ray_cluster``), through ``grpo_dist.train.train``.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import e2e
from bpe_model import make_bpe_model
from grpo_dist.config import Config, load_config
from grpo_dist.hub import is_hub_id
from test_prepare_gsm8k import TEST, TRAIN

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = sorted((ROOT / "configs").glob("*.yaml"))
IDS = [p.stem for p in CONFIGS]
PREPARE = re.compile(r"python -m grpo_dist\.data\.prepare (\w+) --out (\S+)")
SMOLLM2 = "pkg:smollm2-135m-instruct"


def header(path: Path) -> str:
    """The comment lines a config opens with."""
    lines = path.read_text().splitlines()
    return "\n".join(ln for ln in lines[:next((i for i, ln in enumerate(lines) if not ln.startswith("#")), 0)])


def _set(tree: dict, dotted: str, value: Any) -> None:
    *parents, last = dotted.split(".")
    for p in parents:
        tree = tree.setdefault(p, {})
    tree[last] = value


@pytest.fixture(scope="module")
def standin(tmp_path_factory) -> Path:
    return make_bpe_model(tmp_path_factory.mktemp("standin") / "model")


@pytest.fixture(scope="module")
def gsm8k_copy(tmp_path_factory) -> Path:
    """openai/gsm8k (main) as the Hub serves it, four real rows, saved as a datasets directory."""
    import datasets

    out = tmp_path_factory.mktemp("gsm8k") / "copy"
    datasets.DatasetDict({"train": datasets.Dataset.from_list(TRAIN),
                          "test": datasets.Dataset.from_list(TEST)}).save_to_disk(str(out))
    return out


def data_overrides(path: Path, cfg: Config, tmp: Path, source: Path) -> dict:
    """Run the commands that write the config's data files (its header's, checked against
    docs/data.md) into ``tmp``; the overrides that point the config there."""
    commands = [(m.group(0), m.group(1), m.group(2)) for m in PREPARE.finditer(header(path))]
    doc = (ROOT / "docs" / "data.md").read_text()
    assert f"`configs/{path.name}`" in doc, f"docs/data.md does not say where {path.name}'s data comes from"
    sources = [("data.path", cfg.data.path), ("data.eval_path", cfg.data.eval_path)]
    sources += [(f"eval.extra.{k}", v) for k, v in cfg.eval.extra.items()]
    over: dict = {}
    for key, src in sources:
        if src in (None, "auto") or src.startswith("builtin:"):
            continue
        made = [(c, ds, out) for c, ds, out in commands if Path(src).parent == Path(out)]
        assert made, (f"{path.name}: {key} {src}: no `python -m grpo_dist.data.prepare ... --out DIR` in its "
                      f"header comment writes it")
        cmd, dataset, out = made[0]
        assert cmd in doc, f"{path.name}: docs/data.md does not give `{cmd}`"
        local = tmp / out.lstrip("/")
        if not local.is_dir():
            r = subprocess.run([sys.executable, "-m", "grpo_dist.data.prepare", dataset, "--out", str(local),
                                "--source", str(source)], cwd=ROOT, capture_output=True, text=True, timeout=120)
            assert r.returncode == 0, r.stderr
        assert (local / Path(src).name).is_file(), f"{path.name}: `{cmd}` does not write {key} {src}"
        _set(over, key, str(local / Path(src).name))
    return over


def model_overrides(path: Path, cfg: Config, own: Path, standin: Path, packaged: bool = False) -> dict:
    """The model the checks run on: the config's own where this machine has it offline (tiny_cpu's
    make_if_missing recipe is the ``pretrained_model_dir`` fixture's; with ``packaged``, SmolLM2's
    ``pkg:`` source, which the ``smollm2_dir`` fixture has converted into the cache), else the stand-in."""
    m = cfg.model
    if m.make_if_missing is not None:
        spec = m.make_if_missing
        assert (spec.size, spec.pretrain_task, spec.seed, spec.steps) == ("tiny", "add", 0, None), \
            f"{path.name}: model.make_if_missing is not the pretrained_model_dir fixture's recipe: update this test"
        return {"path": str(own), "make_if_missing": None}
    if packaged and m.path == SMOLLM2:
        return {}
    if not is_hub_id(m.path):  # a directory on the nodes (a GPU recipe): the header says how to fetch it
        assert Path(m.path).is_dir() or f"--local-dir {m.path}" in header(path), \
            f"{path.name}: model.path {m.path} is not here and its header comment gives no command that writes it"
    return {"path": str(standin)}


@pytest.mark.parametrize("path", CONFIGS, ids=IDS)
def test_every_shipped_config_passes_preflight(path, request, tmp_path, gsm8k_copy, standin, pretrained_model_dir):
    from grpo_dist.run import preflight

    shipped = load_config(path)
    if shipped.model.path == SMOLLM2:
        request.getfixturevalue("smollm2_dir")  # converted once into the cache (session fixture)
    over = data_overrides(path, shipped, tmp_path, gsm8k_copy)
    model = model_overrides(path, shipped, pretrained_model_dir, standin, packaged=True)
    if model:  # (an empty mapping would clear the section)
        over["model"] = model
    if shipped.logging.wandb_mode == "online":
        over["logging"] = {"wandb_mode": "offline"}  # online needs a W&B key and the server
    said: list[str] = []
    checked = preflight.check(load_config(path, over), said.append)
    assert checked.train, said
    assert bool(checked.evals) == (shipped.data.eval_path is not None), said
    assert sorted(checked.extra) == sorted(shipped.eval.extra), said


def one_step(path: Path, cfg: Config, tmp: Path, source: Path, own: Path, standin: Path) -> Config:
    """``cfg`` for one step on this machine's CPUs with a small model: devices, scale, evaluation,
    checkpoints and W&B off; the rest as shipped."""
    model = model_overrides(path, cfg, own, standin)
    over: dict[str, Any] = {
        **data_overrides(path, cfg, tmp / "data", source),
        "output_dir": str(tmp / "run"),
        "model": {**model, "dtype": "float32", "max_model_len": min(cfg.model.max_model_len, 2048)},
        "rollout": {"backend": "hf", "num_workers": 1, "prompts_per_step": min(cfg.rollout.prompts_per_step, 2),
                    "group_size": min(cfg.rollout.group_size, 4), "max_tokens": min(cfg.rollout.max_tokens, 8)},
        "reward": {"num_workers": 1},
        "learner": {"num_learners": 1, "torch_adam": True},  # DeepSpeed's fused Adam is the GPU recipe's
        "cluster": {"address": None, "num_cpus": 2, "rollout_cpus": 0.5, "reward_cpus": 0.25, "learner_cpus": 0.5,
                    "rollout_gpus": 0, "learner_gpus": 0, "torch_threads": 1},
        "trainer": {"steps": 1, "eval_before_after": False, "eval_every": 0},
        "eval": {"extra": {}},
        "checkpoint": {"every": 0},
        "logging": {"wandb_mode": "disabled", "progress": False},
    }
    if cfg.rollout.multi_turn:
        over["rollout"]["max_total_tokens"] = min(cfg.rollout.max_total_tokens or 24, 24)
    return load_config(path, over)


@pytest.mark.slow
@pytest.mark.parametrize("path", CONFIGS, ids=IDS)
def test_every_shipped_config_trains_one_step(path, ray_cluster, tmp_path, gsm8k_copy, standin, pretrained_model_dir):
    cfg = one_step(path, load_config(path), tmp_path, gsm8k_copy, pretrained_model_dir, standin)
    run, summary = e2e.train_run(cfg)
    assert summary["steps"] == 1 and len(run.history) == 1
    h = run.history[0]
    assert h["rollout/num_completions"] == cfg.rollout.prompts_per_step * cfg.rollout.group_size, h
    # each reward function of the config scored the batch, none failed
    failures = {k.removeprefix("reward/failure_rate/"): v for k, v in h.items() if k.startswith("reward/failure_rate/")}
    assert len(failures) == len(cfg.reward.functions) and all(f"reward/{n}" in h for n in failures), sorted(h)
    assert not any(failures.values()), failures
    print(path.stem, {k: round(v, 3) for k, v in h.items() if k.startswith(("reward/", "rollout/env", "train/loss"))})
