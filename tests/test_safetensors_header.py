"""The safetensors header check on real files (written by ``safetensors``, then cut or extended):
what the pre-flight says agrees with what the safetensors loader accepts."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from grpo_dist.config import ConfigError
from grpo_dist.run.preflight import _check_weights
from grpo_dist.util.safetensors_header import WeightsError, read_header, shapes


def _loads(path) -> bool:
    try:
        with safe_open(str(path), "pt") as f:
            list(f.keys())
        return True
    except Exception:  # noqa: BLE001 - whatever the loader refuses
        return False


@pytest.fixture()
def weights(tmp_path):
    p = tmp_path / "model.safetensors"
    save_file({"a.weight": torch.zeros(300, 400), "b.weight": torch.ones(7)}, str(p))
    return p


def test_whole_file_reads_and_every_broken_one_is_refused_as_the_loader_refuses_it(weights, tmp_path):
    assert shapes(weights) == {"a.weight": [300, 400], "b.weight": [7]} and _loads(weights)
    data = weights.read_bytes()
    n = int.from_bytes(data[:8], "little")
    cases = {
        "cut": (data[:-100], r"is truncated: its header says 480\.0 kB of tensors \(2 tensors\), the file holds 479\.9 kB"),
        "extra": (data + b"\0" * 10, r"has 10 bytes after its last tensor"),
        "in_header": (data[: 8 + n // 2], r"is truncated inside its header"),
        "short": (data[:5], r"is truncated: 5 bytes, not even the 8-byte header length"),
        "not_a_table": (data[:8] + b"[1]".ljust(n) + data[8 + n:], r"has a corrupt header \(not a tensor table"),
        "html": (b"<!DOCTYPE html><html>error</html>", r"is not a safetensors file"),
    }
    for name, (content, pattern) in cases.items():
        p = tmp_path / f"{name}.safetensors"
        p.write_bytes(content)
        with pytest.raises(WeightsError, match=pattern):
            read_header(p)
        assert not _loads(p), name  # the loader refuses each too


def test_an_index_naming_a_missing_shard_is_one_line(weights, tmp_path):
    d = tmp_path / "sharded"
    d.mkdir()
    shutil.copy(weights, d / "model-00001-of-00002.safetensors")
    (d / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {
        "a.weight": "model-00001-of-00002.safetensors", "c.weight": "model-00002-of-00002.safetensors"}}))
    with pytest.raises(ConfigError, match=r"model\.path: .*model\.safetensors\.index\.json names 1 of 2 shards that are "
                                          r"not in .* \(first: model-00002-of-00002\.safetensors\)"):
        _check_weights(d)
