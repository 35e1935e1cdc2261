"""``grpo-dist eval --adapter DIR`` with an adapter trained on another base model: exit 2 and one
line naming the mismatch, before any engine starts (issue 22). The adapters are real PEFT
adapters of small real models (another Llama's shapes, a GPT-2's modules), saved as training
saves them; the check reads only the safetensors headers.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from grpo_dist.config import ConfigError
from grpo_dist.run.adapter_check import check_adapter
from grpo_dist.run.checkpoint import set_base_model

ROOT = Path(__file__).resolve().parents[1]


def _adapter(model, base: Path, out: Path, targets: list[str], **lora) -> Path:
    """``model`` saved as a base model at ``base``, and a LoRA adapter of it at ``out``."""
    from peft import LoraConfig, get_peft_model

    model.save_pretrained(base)
    peft = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, target_modules=targets, **lora))
    peft.save_pretrained(out)
    set_base_model(out, str(base))  # as training writes it
    return out


@pytest.fixture(scope="module")
def adapters(tmp_path_factory, tiny_model_dir):
    import torch
    from transformers import AutoModelForCausalLM, GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    d = tmp_path_factory.mktemp("adapters")
    narrow = LlamaForCausalLM(LlamaConfig(vocab_size=101, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                          num_attention_heads=2, num_key_value_heads=2, head_dim=32))
    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=101, n_embd=64, n_layer=2, n_head=2, n_positions=64))
    same = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    return {
        "narrow": _adapter(narrow, d / "llama-hidden64", d / "narrow_adapter", ["q_proj", "v_proj"]),
        "gpt2": _adapter(gpt2, d / "gpt2-tiny", d / "gpt2_adapter", ["c_attn"], fan_in_fan_out=True),
        "same": _adapter(same, d / "tiny-copy", d / "same_adapter", ["q_proj", "k_proj", "v_proj", "o_proj",
                                                                     "gate_proj", "up_proj", "down_proj"]),
        "gpt2_base": d / "gpt2-tiny",
    }


def _eval(model: Path, adapter: Path, out: Path) -> tuple[subprocess.CompletedProcess, float]:
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "grpo_dist.cli", "eval", "--config", "configs/tiny_cpu.yaml",
                        "--model.path", str(model), "--model.make_if_missing", "null", "--output_dir", str(out),
                        "--logging.wandb_mode", "disabled", "--adapter", str(adapter)],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    return r, time.perf_counter() - t0


CASES = [
    ("adapter of a model with other shapes", "narrow",
     r"--adapter: {a} was trained on {d}/llama-hidden64 \(model\.layers\.0\.self_attn\.q_proj: lora_A 8x64, lora_B "
     r"64x8, for a 64x64 weight\) but model\.path {m} has 128x128 there \(hidden_size 128\); 4 of 4 adapted modules "
     r"differ; evaluate it with --model\.path {d}/llama-hidden64"),
    ("adapter of a model with other modules", "gpt2",
     r"--adapter: {a} was trained on {d}/gpt2-tiny, whose modules model\.path {m} does not have: "
     r"transformer\.h\.0\.attn\.c_attn \(and 1 more; adapter target_modules \[c_attn\]; the model's: down_proj, "
     r"gate_proj, k_proj, lm_head, o_proj, q_proj, up_proj, v_proj\); evaluate it with --model\.path {d}/gpt2-tiny"),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_eval_of_an_adapter_of_another_base_exits_2_with_one_line(case, adapters, tiny_model_dir, tmp_path):
    name, key, pattern = case
    a = adapters[key]
    r, seconds = _eval(tiny_model_dir, a, tmp_path / "out")
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.returncode == 2, r.stderr[-3000:]
    assert len(lines) == 1, r.stderr
    expected = pattern.format(a=re.escape(str(a)), d=re.escape(str(a.parent)), m=re.escape(str(tiny_model_dir)))
    assert re.fullmatch("config error: " + expected, lines[0]), lines[0]
    assert "engines ready" not in r.stdout and "starting" not in r.stdout  # no engine started
    print(f"\nbad input | eval --adapter: {name} | {lines[0]} | {seconds:.1f} s")  # docs/errors.md's table (pytest -s)


def test_an_adapter_of_this_base_passes_and_fan_in_fan_out_is_read(adapters, tiny_model_dir):
    check_adapter(str(adapters["same"]), str(tiny_model_dir))
    check_adapter(str(adapters["gpt2"]), str(adapters["gpt2_base"]))  # Conv1D weights are stored in x out
    with pytest.raises(ConfigError, match=r"^--adapter: .*narrow_adapter was trained on "):
        check_adapter(str(adapters["narrow"]), str(tiny_model_dir))
