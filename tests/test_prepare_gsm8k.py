"""GSM8K preparation (``python -m grpo_dist.data.prepare gsm8k``) and the GSM8K recipe's data and
reward path, offline: real GSM8K rows written here, saved as a local datasets directory."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from grpo_dist.config import load_config
from grpo_dist.data.prepare import gsm8k_answer
from grpo_dist.reward.math_answer import math_reward

ROOT = Path(__file__).resolve().parents[1]

# Real rows of openai/gsm8k (main): two from train, two from test.
TRAIN = [
    {"question": "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
                 "How many clips did Natalia sell altogether in April and May?",
     "answer": "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\nNatalia sold 48+24 = <<48+24=72>>72 clips "
               "altogether in April and May.\n#### 72"},
    {"question": "Weng earns $12 an hour for babysitting. Yesterday, she just did 50 minutes of babysitting. "
                 "How much did she earn?",
     "answer": "Weng earns 12/60 = $<<12/60=0.2>>0.2 per minute.\nWorking 50 minutes, she earned 0.2 x 50 = "
               "$<<0.2*50=10>>10.\n#### 10"},
]
TEST = [
    {"question": "Janet’s ducks lay 16 eggs per day. She eats three for breakfast every morning and bakes muffins "
                 "for her friends every day with four. She sells the remainder at the farmers' market daily for $2 "
                 "per fresh duck egg. How much in dollars does she make every day at the farmers' market?",
     "answer": "Janet sells 16 - 3 - 4 = <<16-3-4=9>>9 duck eggs a day.\nShe makes 9 * 2 = $<<9*2=18>>18 every "
               "day at the farmer’s market.\n#### 18"},
    {"question": "A robe takes 2 bolts of blue fiber and half that much white fiber. How many bolts in total "
                 "does it take?",
     "answer": "It takes 2/2=<<2/2=1>>1 bolt of white fiber\nSo the total amount of fabric is 2+1=<<2+1=3>>3 "
               "bolts of fabric\n#### 3"},
]


def test_gsm8k_answer():
    assert gsm8k_answer(TRAIN[0]["answer"]) == "72"
    assert gsm8k_answer("so 1000 + 234 = 1,234\n#### 1,234") == "1234"
    with pytest.raises(ValueError, match="####"):
        gsm8k_answer("no final answer here")


def test_prepare_command_and_recipe_data(tmp_path):
    datasets = pytest.importorskip("datasets")
    src = tmp_path / "gsm8k-copy"
    datasets.DatasetDict({"train": datasets.Dataset.from_list(TRAIN),
                          "test": datasets.Dataset.from_list(TEST)}).save_to_disk(str(src))
    out = tmp_path / "data" / "gsm8k"
    r = subprocess.run([sys.executable, "-m", "grpo_dist.data.prepare", "gsm8k", "--out", str(out),
                        "--source", str(src)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    rows = [json.loads(x) for x in (out / "train.jsonl").read_text().splitlines()]
    assert [x["answer"] for x in rows] == ["72", "10"] and rows[0]["prompt"] == TRAIN[0]["question"]
    assert rows[1]["solution"] == TRAIN[1]["answer"]

    # the recipe's data section on these files: eval_path auto finds test.jsonl
    from grpo_dist.run.prepare import load_data

    cfg = load_config(ROOT / "configs" / "gsm8k_qwen2.5_0.5b.yaml",
                      {"data": {"path": str(out / "train.jsonl"), "chat_template": False}})
    said = []
    train, evals = load_data(cfg, log_fn=said.append)
    assert [t.answer for t in train] == ["72", "10"] and [e.answer for e in evals] == ["18", "3"]
    assert said == [f"evaluation: 2 prompts from {out / 'test.jsonl'} (data.eval_path auto)"]
    # the recipe's reward on the kind of completion its system prompt asks for
    comps = ["Janet sells 16 - 3 - 4 = 9 eggs and makes 9 * 2 = 18 dollars. The answer is \\boxed{18}.",
             "2 + 1 = 3 bolts, so \\boxed{4}."]
    assert math_reward([e.prompt for e in evals], comps, answer=[e.answer for e in evals]) == [1.0, 0.0]


def test_prepare_bad_source_is_one_line(tmp_path):
    r = subprocess.run([sys.executable, "-m", "grpo_dist.data.prepare", "gsm8k", "--out", str(tmp_path / "o"),
                        "--source", str(tmp_path / "missing.jsonl")], cwd=ROOT, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 2 and r.stderr.startswith("error: ") and r.stderr.count("\n") == 1
