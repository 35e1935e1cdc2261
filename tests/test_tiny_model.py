"""The locally generated tiny model: loading, tokenizer, PEFT, a short pretraining run."""

from __future__ import annotations

import json
import os

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from grpo_dist.models import INFO_FILE, SIZES, build_tokenizer, generate, make_tiny_model  # noqa: E402

TEXTS = [
    "12+34=46",
    "  leading and trailing spaces  ",
    "a  b\tc\nd",
    "<think>7 + 5 = 12, so the answer is 12</think><answer>12</answer>",
    "user: what is 3*4?\nassistant: 3*4 = 12.",
    "punctuation !\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~ end",
]


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("tiny")
    info = make_tiny_model(str(out), size="tiny", seed=0, log=None)
    return str(out), info


def test_files_and_config(tiny_dir):
    out, info = tiny_dir
    for name in ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
                 INFO_FILE):
        assert os.path.exists(os.path.join(out, name)), name
    cfg = transformers.AutoConfig.from_pretrained(out)
    assert cfg.head_dim >= 32 and cfg.hidden_size // cfg.num_attention_heads >= 32
    assert cfg.max_position_embeddings == 256
    tok = transformers.AutoTokenizer.from_pretrained(out)
    assert (cfg.bos_token_id, cfg.eos_token_id, cfg.pad_token_id) == (
        tok.bos_token_id, tok.eos_token_id, tok.pad_token_id)
    assert cfg.vocab_size == len(tok) == info["vocab_size"]
    gen = json.load(open(os.path.join(out, "generation_config.json")))
    assert gen["eos_token_id"] == tok.eos_token_id and gen["pad_token_id"] == tok.pad_token_id
    assert info["pretrain_task"] is None and info["num_parameters"] > 0


def test_load_and_forward(tiny_dir):
    out, _ = tiny_dir
    model = transformers.AutoModelForCausalLM.from_pretrained(out)
    tok = transformers.AutoTokenizer.from_pretrained(out)
    batch = tok(["1+2=", "12+34="], return_tensors="pt", padding=True)
    logits = model(**batch).logits
    assert logits.shape == (2, batch["input_ids"].shape[1], len(tok))
    assert torch.isfinite(logits).all()


@pytest.mark.parametrize("text", TEXTS)
def test_tokenizer_roundtrip(tiny_dir, text):
    tok = transformers.AutoTokenizer.from_pretrained(tiny_dir[0])
    ids = tok.encode(text)
    assert ids[0] == tok.bos_token_id and len(ids) == len(text) + 1  # one token per character
    assert tok.decode(ids, skip_special_tokens=True) == text
    assert tok.decode(ids[1:]) == text
    assert tok.unk_token_id not in ids
    assert tok.decode([tok.convert_tokens_to_ids(c) for c in "a b"]) == "a b"  # no inserted spaces


def test_tokenizer_specials_and_template(tiny_dir):
    tok = transformers.AutoTokenizer.from_pretrained(tiny_dir[0])
    assert (tok.bos_token, tok.eos_token, tok.pad_token, tok.unk_token) == ("<s>", "</s>", "<pad>", "<unk>")
    assert len({tok.bos_token_id, tok.eos_token_id, tok.pad_token_id, tok.unk_token_id}) == 4
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "1+1="}]
    text = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    assert text == "system: Be brief.\nuser: 1+1=\nassistant: "
    assert tok.encode("é", add_special_tokens=False) == [tok.unk_token_id]
    assert build_tokenizer().get_vocab() == tok.get_vocab()


def test_peft_lora_backward(tiny_dir):
    peft = pytest.importorskip("peft")
    model = transformers.AutoModelForCausalLM.from_pretrained(tiny_dir[0])
    tok = transformers.AutoTokenizer.from_pretrained(tiny_dir[0])
    cfg = peft.LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"],
                          lora_dropout=0.0, task_type="CAUSAL_LM")
    pm = peft.get_peft_model(model, cfg)
    batch = tok(["12+34=46"], return_tensors="pt")
    loss = pm(**batch, labels=batch["input_ids"]).loss
    loss.backward()
    grads = [p.grad for n, p in pm.named_parameters() if p.requires_grad]
    assert grads and all(g is not None for g in grads)
    assert any(g.abs().sum() > 0 for g in grads)
    assert all("lora_" in n for n, p in pm.named_parameters() if p.requires_grad)


def test_same_seed_same_model(tmp_path, tiny_dir):
    info = make_tiny_model(str(tmp_path / "again"), size="tiny", seed=0, log=None)
    a = transformers.AutoModelForCausalLM.from_pretrained(tiny_dir[0]).state_dict()
    b = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "again")).state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert info["num_parameters"] == tiny_dir[1]["num_parameters"]


def test_small_size_shape():
    dims = SIZES["small"]
    assert dims["hidden_size"] // dims["num_attention_heads"] >= 32
    assert dims["num_attention_heads"] % dims["num_key_value_heads"] == 0


def test_short_pretraining(tmp_path):
    lines = []
    info = make_tiny_model(str(tmp_path / "pt"), size="tiny", seed=1, pretrain_task="add", steps=40,
                           eval_n=16, eval_samples=2, log=lines.append)
    for key in ("steps", "p_correct", "loss_first", "loss_last", "train_seconds",
                "eval_greedy_acc", "eval_sampled_acc", "eval_n"):
        assert key in info, key
    assert info["steps"] == 40 and info["eval_n"] == 16
    assert info["loss_last"] < info["loss_first"]
    assert 0.0 <= info["eval_greedy_acc"] <= 1.0 and 0.0 <= info["eval_sampled_acc"] <= 1.0
    assert any("held-out" in line for line in lines)
    saved = json.load(open(tmp_path / "pt" / INFO_FILE))
    assert saved["loss_last"] == info["loss_last"]
    model = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "pt"))
    tok = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "pt"))
    outs = generate(model, tok, ["1+2=", "12+34="], max_new_tokens=4)
    assert len(outs) == 2 and all(isinstance(o, str) and len(o) <= 4 for o in outs)
