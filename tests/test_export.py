"""`grpo-dist export` (issue 55 item 5): a run's adapter merged into its base, a directory that
transformers and vLLM load, answering the held-out prompts greedily as the run's adapter does.

The run directory is made here, not trained (seconds instead of a Ray run): the demo's base model,
a seeded random LoRA adapter on every projection saved by PEFT, and run.json, config.yaml and
summary.json written by the functions a run writes them with.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import e2e
from grpo_dist.cli import main

ROOT = Path(__file__).resolve().parents[1]
N_PROMPTS = 24
MAX_TOKENS = 6  # the demo's rollout.max_tokens
EOS = 2  # the tiny tokenizer's </s>


def _report(acc: float) -> dict:
    return {"sampled_accuracy": acc, "greedy_accuracy": acc + 0.05, "pass@1": acc, "pass@4": acc + 0.2,
            "mean_reward": acc, "num_prompts": 128, "samples_per_prompt": 4, "temperature": 1.0}


def make_adapter(base: Path, out: Path, seed: int = 0) -> None:
    """A PEFT LoRA adapter on every projection of ``base``, B seeded noise (PEFT starts it at 0)."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from grpo_dist.run.checkpoint import set_base_model

    torch.manual_seed(seed)
    m = get_peft_model(AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32),
                       LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj",
                                                                      "up_proj", "down_proj"]))
    with torch.no_grad():
        for name, p in m.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape) * 0.3)
    m.save_pretrained(out)
    set_base_model(out, str(base))  # as a run's final save leaves it: the base's absolute path


def make_run(base: Path, run_dir: Path) -> None:
    from grpo_dist.run.outputs import write_run_files, write_summary

    cfg = e2e.config(base, run_dir)
    cfg.trainer.run_id = "0123abcd4567"
    write_run_files(cfg)  # run.json (run id, code, machine), config.yaml
    make_adapter(base, run_dir / "adapter")
    write_summary(run_dir, 2, 75.0, run_dir / "adapter", None, {}, [], _report(0.25), _report(0.5))


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory, pretrained_model_dir) -> Path:
    d = tmp_path_factory.mktemp("export") / "run"
    make_run(pretrained_model_dir, d)
    return d


@pytest.fixture(scope="module")
def exported(run_dir) -> Path:
    out = run_dir.parent / "model"
    assert main(["export", str(run_dir), str(out)]) == 0
    return out


@pytest.fixture(scope="module")
def held_out(run_dir, pretrained_model_dir) -> list[list[int]]:
    """The prompt ids of the first held-out records, as the rollout workers tokenise them."""
    from transformers import AutoTokenizer

    from grpo_dist.run.prepare import load_data

    cfg = e2e.config(pretrained_model_dir, run_dir)
    _, evals = load_data(cfg, log_fn=lambda *_: None)
    tok = AutoTokenizer.from_pretrained(pretrained_model_dir)
    return [tok(r.prompt)["input_ids"] for r in evals[:N_PROMPTS]]


def greedy(model, prompts: list[list[int]], max_tokens: int, eos: int) -> list[list[int]]:
    outs = []
    with torch.no_grad():
        for ids in prompts:
            x = torch.tensor([ids])
            y = model.generate(x, attention_mask=torch.ones_like(x), do_sample=False, max_new_tokens=max_tokens,
                               pad_token_id=eos, eos_token_id=eos)[0, len(ids):].tolist()
            outs.append(_until_eos(y, eos))
    return outs


def _until_eos(ids: list[int], eos: int) -> list[int]:
    return ids[:ids.index(eos)] if eos in ids else ids


def test_the_export_has_weights_tokenizer_generation_config_and_a_card(exported, run_dir, pretrained_model_dir):
    from safetensors import safe_open
    from transformers import AutoTokenizer

    names = {p.name for p in exported.iterdir()}
    assert {"config.json", "model.safetensors", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
            "chat_template.jinja", "README.md"} <= names
    assert not any(n.startswith("adapter_") for n in names)  # a plain model: no PEFT files
    assert (exported / "chat_template.jinja").read_text() == (pretrained_model_dir / "chat_template.jinja").read_text()
    tok = AutoTokenizer.from_pretrained(exported)
    assert tok.apply_chat_template([{"role": "user", "content": "1+2="}], tokenize=False, add_generation_prompt=True) \
        == "user: 1+2=\nassistant: "
    with safe_open(str(exported / "model.safetensors"), "pt") as f, \
            safe_open(str(pretrained_model_dir / "model.safetensors"), "pt") as g:
        assert set(f.keys()) == set(g.keys())  # the base's tensors, under the base's names
        assert {f.get_tensor(k).dtype for k in f.keys()} == {torch.float32}  # the base's dtype
    card = (exported / "README.md").read_text()
    run = json.loads((run_dir / "run.json").read_text())
    assert "128 held-out prompts (builtin:add), 4 samples each at temperature 1.0" in card
    assert "library_name: transformers" in card and f"`{pretrained_model_dir}`" in card
    assert "| greedy_accuracy | 0.300 | 0.550 | +0.250 |" in card and "| pass@4 | 0.450 | 0.700 | +0.250 |" in card
    assert "LoRA r=8, alpha=16 on down_proj, gate_proj, k_proj, o_proj, q_proj, up_proj, v_proj merged" in card
    commit = run["code"].get("commit")
    assert (f"commit {commit}" if commit else "commit not recorded") in card and "run id: 0123abcd4567" in card
    assert f"- machine (the driver's): {run['machine']['cpu']}" in card and "exported: 20" in card
    assert (run_dir / "config.yaml").read_text().rstrip() in card  # the recipe
    assert "`vllm serve <this directory> --dtype float32`" in card  # vLLM's auto would serve float32 in bf16


@pytest.fixture(scope="module")
def answers(run_dir, held_out, pretrained_model_dir) -> dict[str, list[list[int]]]:
    """Greedy answers (completion ids up to EOS) of the base and of base + the run's adapter (PEFT,
    unmerged), on the held-out prompts."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(pretrained_model_dir, dtype=torch.float32).eval()
    out = {"base": greedy(base, held_out, MAX_TOKENS, EOS)}
    out["adapter"] = greedy(PeftModel.from_pretrained(base, run_dir / "adapter").eval(), held_out, MAX_TOKENS, EOS)
    return out


def test_the_export_answers_the_held_out_prompts_as_the_adapter_does(exported, answers, held_out):
    """The exported model's greedy answers (transformers) equal base + adapter's, and the adapter
    changes some of the base's answers (else equality proves nothing)."""
    from transformers import AutoModelForCausalLM

    assert json.loads((exported / "generation_config.json").read_text())["eos_token_id"] == EOS
    merged = AutoModelForCausalLM.from_pretrained(exported).eval()
    assert greedy(merged, held_out, MAX_TOKENS, EOS) == answers["adapter"]
    changed = sum(a != b for a, b in zip(answers["adapter"], answers["base"]))
    assert changed >= N_PROMPTS // 4, answers


@pytest.mark.budget(180)
def test_vllm_serves_the_export_with_the_same_answers(exported, answers, held_out):
    """vLLM (its CPU build, in process, in a process of its own) loads the export as it is and
    answers greedily as base + adapter does."""
    spec = exported.parent / "vllm_prompts.json"
    spec.write_text(json.dumps({"prompt_ids": held_out, "max_tokens": MAX_TOKENS, "max_model_len": 64}))
    env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    r = subprocess.run([sys.executable, str(ROOT / "tests" / "export_vllm_probe.py"), str(exported), str(spec)],
                       capture_output=True, text=True, timeout=600, env=env, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert [_until_eos(g, EOS) for g in got] == answers["adapter"]


def test_adapter_only_keeps_the_peft_files_and_adds_the_card(run_dir, tmp_path):
    out = tmp_path / "adapter_export"
    assert main(["export", str(run_dir), str(out), "--adapter-only"]) == 0
    assert {p.name for p in out.iterdir()} == {p.name for p in (run_dir / "adapter").iterdir()} | {"README.md"}
    for f in (run_dir / "adapter").iterdir():
        if f.name != "README.md":  # PEFT's own card template: the export's card replaces it
            assert (out / f.name).read_bytes() == f.read_bytes(), f.name
    card = (out / "README.md").read_text()
    assert "library_name: peft" in card and "PeftModel.from_pretrained" in card and "| sampled_accuracy |" in card


def test_a_bf16_sharded_base_is_merged_in_its_dtype_shard_by_shard(tmp_path, pretrained_model_dir):
    """The merge keeps the base's dtype and shard layout: each merged weight is bf16(W + s * B @ A)
    with W the stored bf16 weight, each untouched one the base's own bytes."""
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from grpo_dist.sync.merge import lora_factors, read_adapter_dir

    base = tmp_path / "bf16"
    AutoModelForCausalLM.from_pretrained(pretrained_model_dir, dtype=torch.bfloat16).save_pretrained(
        base, max_shard_size="300KB")
    for f in pretrained_model_dir.glob("*"):
        if f.name.startswith(("tokenizer", "chat_template")):
            shutil.copy(f, base / f.name)
    shards = sorted(p.name for p in base.glob("*.safetensors"))
    assert len(shards) > 1 and (base / "model.safetensors.index.json").is_file()
    run = tmp_path / "run"
    make_run(base, run)
    out = tmp_path / "out"
    assert main(["export", str(run), str(out)]) == 0
    assert sorted(p.name for p in out.glob("*.safetensors")) == shards
    assert (out / "model.safetensors.index.json").read_text() == (base / "model.safetensors.index.json").read_text()
    factors = lora_factors(*read_adapter_dir(run / "adapter"))
    merged = 0
    for shard in shards:
        got, stored = load_file(str(out / shard)), load_file(str(base / shard))
        assert got.keys() == stored.keys()
        for name, w in stored.items():
            assert got[name].dtype == torch.bfloat16
            if name in factors:
                b, a, s, _ = factors[name]
                assert torch.equal(got[name], torch.addmm(w.float(), b.float(), a.float(), alpha=s).bfloat16()), name
                merged += 1
            else:
                assert torch.equal(got[name], w), name
    assert merged == len(factors) == 14  # 7 projections x 2 layers
    assert AutoModelForCausalLM.from_pretrained(out).dtype == torch.bfloat16


def test_a_checkpoint_and_a_full_weight_run_export_too(run_dir, tmp_path, pretrained_model_dir):
    """RUN_DIR/checkpoints/step_N: its adapter, the run's card; a full-weight run (lora off): its
    model directory copied with the card."""
    ckpt = tmp_path / "run" / "checkpoints" / "step_2"
    shutil.copytree(run_dir, tmp_path / "run", ignore=shutil.ignore_patterns("adapter"))
    shutil.copytree(run_dir / "adapter", ckpt / "adapter")
    (ckpt / "trainer_state.json").write_text(json.dumps({"step": 1, "run": {"eval_before": _report(0.25),
                                                                           "wall_seconds": 30.0}}))
    assert main(["export", str(ckpt), str(tmp_path / "from_ckpt")]) == 0
    card = (tmp_path / "from_ckpt" / "README.md").read_text()  # step 1's adapter: not the run's final figures
    assert "| sampled_accuracy | 0.250 | - | - |" in card and "- steps: 1, 0.5 min" in card
    assert "run id: 0123abcd4567" in card and "Not evaluated after training" in card

    full = tmp_path / "full"
    shutil.copytree(run_dir, full, ignore=shutil.ignore_patterns("adapter"))
    shutil.copytree(pretrained_model_dir, full / "adapter")
    assert main(["export", str(full), str(tmp_path / "full_out")]) == 0
    for f in pretrained_model_dir.glob("*.safetensors"):
        assert (tmp_path / "full_out" / f.name).read_bytes() == f.read_bytes()
    assert "(full weights)" in (tmp_path / "full_out" / "README.md").read_text()


def test_a_push_the_hub_refuses_keeps_the_export_and_fails_in_one_line(run_dir, tmp_path):
    """Online mode, the hub's endpoint a loopback port where nothing listens: the export is written,
    the upload fails in one line naming the command that uploads it later; exit 1."""
    from grpo_dist.util.ports import free_port

    env = {k: v for k, v in os.environ.items() if k != "HF_HUB_OFFLINE"}
    env.update(HF_ENDPOINT=f"http://127.0.0.1:{free_port()}", HF_TOKEN="hf_not_a_real_token")
    out = tmp_path / "pushed"
    r = subprocess.run([sys.executable, "-m", "grpo_dist.cli", "export", str(run_dir), str(out), "--push-to-hub",
                        "me/tiny-grpo"], capture_output=True, text=True, timeout=300, env=env, cwd=ROOT)
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.returncode == 1 and len(lines) == 1, r.stderr[-3000:]
    assert lines[0].startswith("error: --push-to-hub me/tiny-grpo: the upload failed (") and \
        lines[0].endswith(f"the export is in {out}: upload it later with `hf upload me/tiny-grpo {out}`"), lines[0]
    assert (out / "model.safetensors").is_file() and (out / "README.md").is_file()


@pytest.mark.parametrize("case", ["no run dir", "unfinished run", "out not empty", "several adapters",
                                  "adapter-only of full weights", "push offline", "base model gone"])
def test_what_cannot_be_exported_fails_in_one_line(case, run_dir, tmp_path, capsys, monkeypatch):
    out, args = tmp_path / "out", []
    src = run_dir
    if case == "no run dir":
        src, want = tmp_path / "nope", r"RUN_DIR .*nope: no such directory"
    elif case == "unfinished run":
        src = tmp_path / "unfinished"
        (src / "checkpoints" / "step_4").mkdir(parents=True)
        want = r"RUN_DIR .*unfinished: no adapter/ \(the run did not finish\); its newest checkpoint can be exported: " \
               r"grpo-dist export .*checkpoints/step_4 OUT"
    elif case == "out not empty":
        out.mkdir()
        (out / "x").write_text("x")
        want = r"OUT .*out exists and is not an empty directory"
    elif case == "several adapters":
        src = tmp_path / "fleet"
        (src / "adapters" / "learner.lr=0.001").mkdir(parents=True)
        want = r"trained several adapters \(learner\.lr=0\.001\): export one of them"
    elif case == "adapter-only of full weights":
        src = tmp_path / "full"
        (src / "adapter").mkdir(parents=True)
        (src / "adapter" / "config.json").write_text("{}")
        args, want = ["--adapter-only"], r"--adapter-only: .* trained full weights"
    elif case == "push offline":  # no network here: HF_HUB_OFFLINE (conftest) says so before anything is written
        monkeypatch.setenv("HF_HUB_OFFLINE", "1")
        args, want = ["--push-to-hub", "me/tiny-grpo"], (r"--push-to-hub me/tiny-grpo: HF_HUB_OFFLINE is set, so the hub "
                                                         r"cannot be reached: export without --push-to-hub and upload "
                                                         r"later \(`hf upload me/tiny-grpo OUT`\)")
    else:
        src = tmp_path / "moved"
        shutil.copytree(run_dir, src)
        conf = json.loads((src / "adapter" / "adapter_config.json").read_text())
        conf["base_model_name_or_path"] = str(tmp_path / "gone")
        (src / "adapter" / "adapter_config.json").write_text(json.dumps(conf))
        want = r"base model .*gone \(the adapter's base_model_name_or_path\) is not on this machine"
    import re

    assert main(["export", str(src), str(out), *args]) == 2
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and re.search(want, lines[0]), lines
    assert not out.exists() or case == "out not empty"  # nothing written
    assert not (tmp_path / ".partial-out").exists()
