"""A real byte-level BPE tokenizer, trained here with the ``tokenizers`` library (GPT-2's scheme:
byte-level pre-tokenizer and decoder, merges learned from text), with a ChatML chat template like
SmolLM2-135M-Instruct's, and a seeded random tiny Llama over its vocabulary: a model that samples
arbitrary token sequences, as a real model sometimes does (no hub download: the ``gpt2`` files are
not available offline)."""

from __future__ import annotations

import contextlib
from pathlib import Path

CHATML = ("{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
          "{{ '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }}{% endif %}"
          "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}{% endfor %}"
          "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def corpus() -> list[str]:
    """Text to learn merges from: the project's own source and the word problems."""
    root = Path(__file__).resolve().parents[1] / "grpo_dist"
    texts = [p.read_text(encoding="utf-8") for p in sorted(root.rglob("*.py"))]
    from grpo_dist.data import make_task

    texts += [r.prompt for r in make_task("tool_problems", 500, seed=0)]
    return texts


def make_bpe_tokenizer(vocab_size: int = 1024):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tk.train_from_iterator(corpus(), trainer)
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, bos_token="<|im_start|>", eos_token="<|im_end|>",
                                  pad_token="<|im_end|>", unk_token="<|endoftext|>")
    tok.chat_template = CHATML
    return tok


def make_bpe_model(out: Path, vocab_size: int = 1024, seed: int = 0) -> Path:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    tok = make_bpe_tokenizer(vocab_size)
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=1, head_dim=32, max_position_embeddings=2048,
                      bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
                      tie_word_embeddings=True)
    model = LlamaForCausalLM(cfg)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


@contextlib.contextmanager
def agent_worker(tmp: Path, agent: str, max_turns: int):
    """A rollout worker on the transformers backend over this BPE model, running ``agent`` (a
    ``file:function`` of tests/agent_helpers.py, logging to ``tmp/log.jsonl``); closed afterwards."""
    from grpo_dist.config import load_config
    from grpo_dist.rollout.worker import RolloutWorker

    cfg = load_config(None, {"model": {"path": str(make_bpe_model(tmp / "model")), "max_model_len": 1024},
                             "lora": {"enabled": False},
                             "rollout": {"backend": "hf", "group_size": 2, "max_tokens": 8, "max_turns": max_turns,
                                         "agent": agent, "agent_kwargs": {"log": str(tmp / "log.jsonl")}}})
    w = RolloutWorker(cfg)
    w.setup()
    try:
        yield w
    finally:
        w.close()
