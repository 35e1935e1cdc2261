"""The tiny model's character-level tokenizer: one token per printable ASCII character, a BOS
prepended, a minimal chat template (``role: content`` lines)."""

from __future__ import annotations

import string

from grpo_dist.models.model import MAX_POSITIONS

SPECIAL_TOKENS = {"pad": "<pad>", "bos": "<s>", "eos": "</s>", "unk": "<unk>"}
# Every printable ASCII character (covers digits, letters, punctuation, operators and the
# characters of <think></think><answer></answer>), plus space, newline and tab.
CHARACTERS = sorted(set(string.printable) - set("\r\x0b\x0c"))
CHAT_TEMPLATE = (
    "{% for message in messages %}{{ message['role'] }}: {{ message['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant: {% endif %}"
)


def build_tokenizer():
    """The character-level ``PreTrainedTokenizerFast`` (BOS prepended, no spaces on decode)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate([SPECIAL_TOKENS[k] for k in ("pad", "bos", "eos", "unk")])}
    for ch in CHARACTERS:
        vocab[ch] = len(vocab)
    core = Tokenizer(models.WordLevel(vocab, unk_token=SPECIAL_TOKENS["unk"]))
    core.pre_tokenizer = pre_tokenizers.Split("", behavior="isolated")  # one token per character
    core.decoder = decoders.Fuse()  # join tokens with no separator
    bos = SPECIAL_TOKENS["bos"]
    core.post_processor = processors.TemplateProcessing(
        single=f"{bos} $A", pair=f"{bos} $A $B", special_tokens=[(bos, vocab[bos])])
    tok = PreTrainedTokenizerFast(
        tokenizer_object=core,
        bos_token=bos, eos_token=SPECIAL_TOKENS["eos"], pad_token=SPECIAL_TOKENS["pad"],
        unk_token=SPECIAL_TOKENS["unk"], model_max_length=MAX_POSITIONS,
        clean_up_tokenization_spaces=False, padding_side="right",
    )
    tok.chat_template = CHAT_TEMPLATE
    return tok
