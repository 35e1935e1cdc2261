"""Prompt sources, PromptStream and the built-in synthetic tasks."""

from __future__ import annotations

import json
import os
import random

import pytest

from grpo_dist.data import PromptRecord, PromptStream, get_task, load_prompts, make_task, task_names
from grpo_dist.data.synthetic import check, extract_last_int, noisy_completion

ROWS = [{"question": f"{i}+{i}=", "solution": str(2 * i), "level": i % 3} for i in range(10)]
EXAMPLE = os.path.join(os.path.dirname(__file__), "..", "grpo_dist", "data", "examples", "add_sample.jsonl")


class CharTok:
    """A stand-in tokenizer with the same chat template as the tiny model's."""

    def apply_chat_template(self, messages, tokenize=False, add_generation_prompt=False):
        assert tokenize is False
        text = "".join(f"{m['role']}: {m['content']}\n" for m in messages)
        return text + ("assistant: " if add_generation_prompt else "")


@pytest.fixture
def rows_std():
    return [{"prompt": r["question"], "answer": r["solution"], "level": r["level"]} for r in ROWS]


def _write_jsonl(path, rows):
    with open(path, "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    return str(path)


def _check_std(records):
    assert [r.id for r in records] == list(range(10))
    assert records[3].prompt == "3+3=" and records[3].answer == "6"
    assert records[3].columns == {"answer": "6", "level": 0}
    assert records[3].as_example() == {"prompt": "3+3=", "answer": "6", "level": 0}


def test_jsonl(tmp_path, rows_std):
    _check_std(load_prompts(_write_jsonl(tmp_path / "d.jsonl", rows_std)))


def test_json_list(tmp_path, rows_std):
    p = tmp_path / "d.json"
    p.write_text(json.dumps(rows_std))
    _check_std(load_prompts(str(p)))


def test_parquet(tmp_path, rows_std):
    pd = pytest.importorskip("pandas")
    p = tmp_path / "d.parquet"
    pd.DataFrame(rows_std).to_parquet(p)
    recs = load_prompts(str(p))
    _check_std(recs)
    assert type(recs[3].columns["level"]) is int  # numpy scalars become plain Python values


def test_saved_hf_dataset(tmp_path, rows_std):
    datasets = pytest.importorskip("datasets")
    single = tmp_path / "single"
    datasets.Dataset.from_list(rows_std).save_to_disk(str(single))
    _check_std(load_prompts(str(single)))
    dd = datasets.DatasetDict({"train": datasets.Dataset.from_list(rows_std),
                               "test": datasets.Dataset.from_list(rows_std[:2])})
    dd.save_to_disk(str(tmp_path / "dict"))
    _check_std(load_prompts(str(tmp_path / "dict")))
    assert len(load_prompts(str(tmp_path / "dict"), split="test")) == 2
    with pytest.raises(ValueError, match="available splits"):
        load_prompts(str(tmp_path / "dict"), split="nope")


def test_builtin():
    recs = load_prompts("builtin:add", limit=20)
    assert len(recs) == 20 and all(r.columns["task"] == "add" for r in recs)
    assert all(int(r.answer) == r.columns["a"] + r.columns["b"] for r in recs)
    recs = load_prompts("builtin:add?n=5&seed=3&max_operand=9", split="eval")
    assert len(recs) == 5 and all(r.columns["a"] <= 9 and r.columns["b"] <= 9 for r in recs)
    assert [r.prompt for r in recs] == [r.prompt for r in make_task("add", 5, seed=3, split="eval", max_operand=9)]
    with pytest.raises(ValueError, match="unknown task"):
        load_prompts("builtin:nope")


def test_example_file_ships():
    recs = load_prompts(EXAMPLE)
    assert 40 <= len(recs) <= 60
    assert all(check(r.answer, str(r.columns["a"] + r.columns["b"])) for r in recs)


def test_column_mapping_and_limit(tmp_path):
    path = _write_jsonl(tmp_path / "raw.jsonl", ROWS)
    recs = load_prompts(path, column_mapping={"question": "prompt", "solution": "answer"}, limit=4)
    assert len(recs) == 4 and recs[2].prompt == "2+2=" and recs[2].answer == "4"
    recs = load_prompts(path, prompt_column="question", answer_column="solution")
    # every column under its own name (as TRL passes them), the answer also as ``answer``
    assert recs[1].prompt == "1+1=" and recs[1].columns == {"solution": "2", "answer": "2", "level": 1}
    recs = load_prompts(path, prompt_column="question", answer_column=None)
    assert recs[0].answer is None and recs[0].columns["solution"] == "0"


def test_missing_prompt_column_message(tmp_path):
    path = _write_jsonl(tmp_path / "raw.jsonl", ROWS)
    with pytest.raises(ValueError) as e:
        load_prompts(path)
    msg = str(e.value)
    assert "'prompt'" in msg and "question" in msg and "solution" in msg


def test_bad_sources(tmp_path):
    with pytest.raises(FileNotFoundError):
        load_prompts(str(tmp_path / "absent.jsonl"))
    (tmp_path / "d.csv").write_text("prompt\nx\n")
    with pytest.raises(ValueError, match="unsupported"):
        load_prompts(str(tmp_path / "d.csv"))
    (tmp_path / "bad.jsonl").write_text('{"prompt": "a"}\nnot json\n')
    with pytest.raises(ValueError, match="bad.jsonl:2"):
        load_prompts(str(tmp_path / "bad.jsonl"))


def test_chat_template(tmp_path, rows_std):
    path = _write_jsonl(tmp_path / "d.jsonl", rows_std)
    recs = load_prompts(path, chat_template=True, tokenizer=CharTok())
    assert recs[1].prompt == "user: 1+1=\nassistant: "
    recs = load_prompts(path, chat_template=True, tokenizer=CharTok(), system_prompt="Add.")
    assert recs[1].prompt == "system: Add.\nuser: 1+1=\nassistant: "
    with pytest.raises(ValueError, match="tokenizer"):
        load_prompts(path, chat_template=True)
    msgs = [{"prompt": [{"role": "user", "content": "hi"}], "answer": "1"}]
    mpath = _write_jsonl(tmp_path / "m.jsonl", msgs)
    assert load_prompts(mpath, chat_template=True, tokenizer=CharTok())[0].prompt == "user: hi\nassistant: "
    with pytest.raises(ValueError, match="chat_template=True"):
        load_prompts(mpath)


def test_chat_template_with_real_tokenizer(tmp_path, rows_std):
    pytest.importorskip("transformers")
    from grpo_dist.models import build_tokenizer

    tok = build_tokenizer()
    tok.save_pretrained(str(tmp_path / "tok"))
    path = _write_jsonl(tmp_path / "d.jsonl", rows_std)
    for t in (tok, str(tmp_path / "tok")):
        recs = load_prompts(path, chat_template=True, tokenizer=t, system_prompt="S")
        assert recs[2].prompt == "system: S\nuser: 2+2=\nassistant: "


def _recs(n):
    return [PromptRecord(i, f"p{i}", {"answer": str(i)}) for i in range(n)]


def test_stream_determinism_and_epochs():
    a, b = PromptStream(_recs(10), seed=7), PromptStream(_recs(10), seed=7)
    ids_a = [r.id for r in a.next_batch(30)]
    assert ids_a == [r.id for r in b.next_batch(30)]
    epochs = [ids_a[i:i + 10] for i in range(0, 30, 10)]
    assert all(sorted(e) == list(range(10)) for e in epochs)  # each epoch is a permutation
    assert epochs[0] != epochs[1] or epochs[1] != epochs[2]  # reshuffled per epoch
    assert [r.id for r in PromptStream(_recs(10), seed=8).next_batch(10)] != epochs[0]
    assert [r.id for r in PromptStream(_recs(5), shuffle=False).next_batch(7)] == [0, 1, 2, 3, 4, 0, 1]
    assert next(iter(a)).id == [r.id for r in b.next_batch(1)][0]


def test_stream_state_roundtrip():
    s = PromptStream(_recs(7), seed=3)
    s.next_batch(10)  # into the second epoch
    state = json.loads(json.dumps(s.state_dict()))  # survives JSON (checkpoint metadata)
    assert state["epoch"] == 1 and state["index"] == 3 and state["seed"] == 3
    expected = [r.id for r in s.next_batch(12)]
    fresh = PromptStream(_recs(7), seed=0)
    fresh.load_state_dict(state)
    assert [r.id for r in fresh.next_batch(12)] == expected
    with pytest.raises(ValueError):
        PromptStream(_recs(6)).load_state_dict(state)
    with pytest.raises(ValueError):
        PromptStream([])


def test_synthetic_split_disjoint_and_deterministic():
    assert {"add"} <= set(task_names())
    train = make_task("add", None, seed=0, split="train")
    held = make_task("add", None, seed=5, split="eval")
    assert len(train) + len(held) == 100 * 100
    assert not {r.prompt for r in train} & {r.prompt for r in held}
    # the split does not depend on the sampling seed
    assert {r.prompt for r in make_task("add", 300, seed=1, split="eval")} <= {r.prompt for r in held}
    assert [r.prompt for r in make_task("add", 50, seed=2)] == [r.prompt for r in make_task("add", 50, seed=2)]
    assert [r.prompt for r in make_task("add", 50, seed=2)] != [r.prompt for r in make_task("add", 50, seed=3)]
    big = make_task("add", len(held) + 5, seed=0, split="eval")  # wraps into a second pass
    assert len(big) == len(held) + 5 and len({r.prompt for r in big}) == len(held)
    small = make_task("add", None, seed=0, split="train", max_operand=9)
    assert all(r.columns["a"] <= 9 for r in small) and len(small) == 90
    r = train[0]
    assert r.prompt == f"{r.columns['a']}+{r.columns['b']}=" and r.answer == str(r.columns["a"] + r.columns["b"])
    with pytest.raises(ValueError):
        make_task("add", 3, split="bogus")


def test_noisy_completion():
    recs = make_task("add", 400, seed=0)
    task = get_task("add")
    for noise, max_off in (("systematic", 1), ("near", 1), ("spread", 90)):  # spread: +-10, swaps
        rng = random.Random(0)
        comps = [noisy_completion(r, rng, 0.4, noise) for r in recs]
        frac = sum(task.check(c, r.answer) for c, r in zip(comps, recs)) / len(recs)
        assert 0.3 < frac < 0.5
        for c, r in zip(comps, recs):
            assert c.isdigit() and abs(int(c) - int(r.answer)) <= max_off
        rng = random.Random(0)
        assert [noisy_completion(r, rng, 0.4, noise) for r in recs] == comps  # deterministic in rng
    offs = {int(noisy_completion(r, rng, 0.0, "spread")) - int(r.answer) for r in recs}
    assert {1, -1, 10, -10} <= offs
    assert {int(noisy_completion(r, rng, 0.0, "near")) - int(r.answer) for r in recs} == {1, -1}
    assert {int(noisy_completion(r, rng, 0.0)) - int(r.answer) for r in recs} == {1}  # systematic
    assert all(task.check(noisy_completion(r, rng, 1.0), r.answer) for r in recs[:50])
    assert not any(task.check(noisy_completion(r, rng, 0.0), r.answer) for r in recs[:50])
    with pytest.raises(ValueError, match="noise"):
        noisy_completion(recs[0], rng, 0.0, "bogus")


@pytest.mark.parametrize("completion,expected", [
    ("46", True), ("46</s>", True), ("<think>40+6</think><answer>46</answer>", True),
    ("the answer is 046", True), ("12 then 46", True), ("46 then 12", False),
    ("", False), ("no number here", False), ("٤٦", False), ("💥\x00\ufffd", False),
    (None, False), (46, False), ("4" * 10000, False), ("-46", False),
])
def test_check_malformed(completion, expected):
    assert check(completion, "46") is expected
    assert get_task("add").check(completion, "46") is expected


def test_check_edge_answers():
    assert check("-3", "-3") and check("x = -3", -3) and not check("3", "-3")
    assert not check("5", None) and not check("5", "five") and check("0", "-0")
    assert extract_last_int("a1b22c333") == "333" and extract_last_int("") is None


# ---------------------------------------------------------------------------------- data.eval_path: auto

def _cfg(**data):
    from grpo_dist.config import config_from_dict

    return config_from_dict({"data": data, "trainer": {"seed": 3}})


def _load(cfg):
    from grpo_dist.run.prepare import load_data

    said = []
    train, evals = load_data(cfg, log_fn=said.append)
    return train, evals, said


def test_auto_eval_builtin_is_the_eval_split_as_before():
    train, evals, _ = _load(_cfg(path="builtin:add", eval_size=16))
    _, explicit, said = _load(_cfg(path="builtin:add", eval_path="builtin:add", eval_size=16))
    assert [r.prompt for r in evals] == [r.prompt for r in explicit] and len(evals) == 16
    assert not {r.prompt for r in evals} & {r.prompt for r in train}
    assert said == []  # an explicit eval_path is not announced


def test_auto_eval_saved_dataset_dict_test_split(tmp_path, rows_std):
    datasets = pytest.importorskip("datasets")
    datasets.DatasetDict({"train": datasets.Dataset.from_list(rows_std[:8]),
                          "test": datasets.Dataset.from_list(rows_std[8:])}).save_to_disk(str(tmp_path / "dd"))
    train, evals, said = _load(_cfg(path=str(tmp_path / "dd"), eval_size=5))
    assert len(train) == 8 and [r.prompt for r in evals] == ["8+8=", "9+9="]
    assert said == [f"evaluation: 2 prompts from the 'test' split of {tmp_path / 'dd'} (data.eval_path auto)"]


def test_auto_eval_sibling_test_file(tmp_path, rows_std):
    (tmp_path / "gsm").mkdir()
    train_path = _write_jsonl(tmp_path / "gsm" / "train.jsonl", rows_std[:7])
    _write_jsonl(tmp_path / "gsm" / "test.jsonl", rows_std[7:])
    train, evals, said = _load(_cfg(path=train_path))
    assert len(train) == 7 and [r.answer for r in evals] == ["14", "16", "18"]
    assert "test.jsonl" in said[0]


def test_auto_eval_holds_out_a_seeded_slice(tmp_path):
    rows = [{"prompt": f"q{i}", "answer": str(i)} for i in range(40)]
    path = _write_jsonl(tmp_path / "only.jsonl", rows)
    train, evals, said = _load(_cfg(path=path, eval_size=6))
    assert len(train) == 34 and len(evals) == 6
    assert not {r.id for r in train} & {r.id for r in evals}
    assert sorted(r.id for r in train + evals) == list(range(40))
    assert [r.id for r in evals] == sorted(r.id for r in evals)  # source order kept
    assert said == [f"evaluation: 6 of the 40 prompts of {path} held out of training "
                    f"(no test split; data.eval_path auto, data.eval_size 6)"]
    again, evals2, _ = _load(_cfg(path=path, eval_size=6))
    assert [r.id for r in evals2] == [r.id for r in evals]  # deterministic (trainer.seed)
    # never more than half of the data
    small = _write_jsonl(tmp_path / "small.jsonl", rows[:5])
    train, evals, _ = _load(_cfg(path=small, eval_size=64))
    assert (len(train), len(evals)) == (3, 2)
    # null: no evaluation, nothing held out
    train, evals, _ = _load(_cfg(path=path, eval_path=None))
    assert len(train) == 40 and evals == []


def test_hf_source_with_config_and_splits_offline(tmp_path, rows_std):
    """``hf:`` goes through ``datasets.load_dataset``; a local data directory exercises the
    same path with no network (HF_HUB_OFFLINE=1 in tests)."""
    d = tmp_path / "hubdata"
    d.mkdir()
    _write_jsonl(d / "train.jsonl", rows_std[:6])
    _write_jsonl(d / "test.jsonl", rows_std[6:])
    assert os.environ.get("HF_HUB_OFFLINE") == "1"
    recs = load_prompts(f"hf:{d}")
    assert len(recs) == 6 and recs[3].answer == "6"
    assert [r.prompt for r in load_prompts(f"hf:{d}", split="test")] == ["6+6=", "7+7=", "8+8=", "9+9="]
    train, evals, said = _load(_cfg(path=f"hf:{d}", eval_size=3))
    assert len(train) == 6 and len(evals) == 3 and "'test' split" in said[0]
