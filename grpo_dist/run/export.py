"""``grpo-dist export RUN_DIR OUT``: a finished run as a model directory that transformers and vLLM
load without grpo_dist or PEFT.

The run's LoRA adapter (``RUN_DIR/adapter``) is merged into its base model, ``W + scaling * B @ A``
in float32 and stored in the base's dtype (``sync/merge.py``, the math the engines serve merged
versions with), one safetensors shard of the base at a time (the base's shard layout and index
kept; memory: one shard). Beside the weights go the base's other files (config, tokenizer, chat
template, generation config; remote code) and a model card, ``README.md`` (``model_card.py``).
``adapter_only`` keeps the PEFT form (the adapter's files and the card); a full-weight run's
``adapter/`` is a model directory already (copied with the card). ``push_to_hub``: then uploaded
with huggingface_hub. The directory is built beside ``OUT`` and renamed when whole.

Every failure is one :class:`ExportError` line (the CLI prints it and exits 1; 2 for what it
could tell before writing anything).
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from grpo_dist.util.disk import WriteError, partial_dir, replace_dir, writing
from grpo_dist.util.files import sync_tree

# files of a model directory that are weights (merged or copied on their own), never copied as they are
_WEIGHTS = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".h5", ".msgpack", ".ckpt", ".onnx", ".index.json")
_NOT_COPIED = {"README.md", ".gitattributes"}


class ExportError(Exception):
    """One line: what could not be exported, and why. ``before_writing``: nothing was written."""

    def __init__(self, msg: str, before_writing: bool = True):
        super().__init__(msg)
        self.before_writing = before_writing


@dataclass
class RunFiles:
    """What an export reads from a run directory (``RUN_DIR``, or one of its checkpoints)."""

    run_dir: Path
    home: Path  # where summary.json, run.json and config.yaml are (run_dir, or a checkpoint's run)
    adapter: Path  # RUN_DIR/adapter: a PEFT adapter dir, or a full model dir (lora.enabled false)
    full: bool
    base: str  # the base model as the adapter names it: a local directory or a hub id
    summary: dict[str, Any] = field(default_factory=dict)
    run_info: dict[str, Any] = field(default_factory=dict)  # run.json: run id, code version, machine
    config_text: str = ""  # config.yaml
    adapter_config: dict[str, Any] = field(default_factory=dict)


def find_run(run_dir: str | Path) -> RunFiles:
    """The run's adapter, base model, summary, run.json and config; ExportError where one is missing."""
    d = Path(run_dir).expanduser().resolve()
    if not d.is_dir():
        raise ExportError(f"RUN_DIR {d}: no such directory (give a run's output_dir)")
    adapter = d / "adapter"
    if not adapter.is_dir():
        if (d / "adapters").is_dir():
            names = sorted(p.name for p in (d / "adapters").iterdir() if p.is_dir())
            raise ExportError(f"RUN_DIR {d} trained several adapters ({', '.join(names)}): export one of them, e.g. "
                              f"grpo-dist export {d / 'adapters' / (names[0] if names else 'NAME')} OUT")
        ckpts = sorted((d / "checkpoints").glob("step_*"), key=lambda p: int(p.name.split("_")[1])) \
            if (d / "checkpoints").is_dir() else []
        hint = f"; its newest checkpoint can be exported: grpo-dist export {ckpts[-1]} OUT" if ckpts else ""
        raise ExportError(f"RUN_DIR {d}: no adapter/ (the run did not finish){hint}")
    # a checkpoint (RUN_DIR/checkpoints/step_N) has its adapter; the run's files are two levels up
    home = d.parent.parent if d.parent.name == "checkpoints" and not (d / "config.yaml").is_file() else d
    conf_file = adapter / "adapter_config.json"
    full = not conf_file.is_file()
    if full and not (adapter / "config.json").is_file():
        raise ExportError(f"{adapter}: neither a PEFT adapter (adapter_config.json) nor a model (config.json)")
    adapter_config = {} if full else _json(conf_file)
    base = str(adapter) if full else str(adapter_config.get("base_model_name_or_path") or "")
    if not base:
        raise ExportError(f"{conf_file} names no base model (base_model_name_or_path)")
    summary = _json(home / "summary.json", {})
    if home != d:  # a checkpoint: its own step and time; the run's evaluation before training, none after
        state = _json(d / "trainer_state.json", {})
        run_state = state.get("run") or {}
        summary = {"steps": state.get("step"), "wall_seconds": run_state.get("wall_seconds"),
                   "eval_before": run_state.get("eval_before") or summary.get("eval_before")}
    return RunFiles(run_dir=d, home=home, adapter=adapter, full=full, base=base, summary=summary,
                    run_info=_json(home / "run.json", {}), adapter_config=adapter_config,
                    config_text=(home / "config.yaml").read_text() if (home / "config.yaml").is_file() else "")


def _json(path: Path, missing: Any = None) -> Any:
    if missing is not None and not path.is_file():
        return missing
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ExportError(f"{path}: cannot read it ({e})") from None


def base_dir(base: str) -> Path:
    """The base model's local directory (a hub id: its snapshot in the HF cache, fetched if needed)."""
    from grpo_dist.hub import local_model_dir

    try:
        path = local_model_dir(base)
    except ValueError as e:
        raise ExportError(f"base model {base}: {e}") from None
    if not (path / "config.json").is_file():
        raise ExportError(f"base model {base} (the adapter's base_model_name_or_path) is not on this machine: "
                          f"export where the run's model.path is, or copy the model there")
    return path


def export(run_dir: str | Path, out: str | Path, adapter_only: bool = False, push_to_hub: str | None = None,
           say: Callable[[str], None] = print) -> Path:
    """Write the export of ``run_dir`` to ``out`` (which must not exist, or be empty); push it to
    the hub repo ``push_to_hub`` if given. Returns ``out``."""
    from grpo_dist.run.model_card import model_card

    run = find_run(run_dir)
    out = Path(out).expanduser().resolve()
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ExportError(f"OUT {out} exists and is not an empty directory: choose a new one")
    if adapter_only and run.full:
        raise ExportError(f"--adapter-only: {run.run_dir} trained full weights (lora.enabled false): there is no "
                          f"adapter to keep")
    if push_to_hub:
        check_hub(push_to_hub)
    base = None if adapter_only or run.full else base_dir(run.base)
    tmp = partial_dir(out)
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        with writing(tmp):
            tmp.mkdir(parents=True)
        if adapter_only or run.full:
            kind = "adapter" if adapter_only else "full"
            _copy_files(run.adapter, tmp, weights=True)
        else:
            kind = "merged"
            say(f"merging {run.adapter} into {base}")
            merge_into(base, run.adapter, tmp)
            _copy_files(base, tmp, weights=False)
        if kind != "adapter":
            _generation_config(tmp)
        with writing(tmp / "README.md"):
            (tmp / "README.md").write_text(model_card(run, kind, base))
        sync_tree(tmp)  # on the disk before the rename names it
        replace_dir(tmp, out)
    except WriteError as e:
        shutil.rmtree(tmp, ignore_errors=True)
        raise ExportError(str(e), before_writing=False) from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    say(f"wrote {out} ({kind}: {_size(out)})")
    if push_to_hub:
        url = push(out, push_to_hub)
        say(f"pushed {out} to {url}")
    return out


def merge_into(base: Path, adapter: Path, out: Path) -> None:
    """The base's safetensors shards with the adapter merged in, written to ``out`` under the same
    names (and the base's shard index)."""
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    from grpo_dist.sync.merge import MergeError, lora_factors, merge_weight, read_adapter_dir

    shards = sorted(base.glob("*.safetensors"))
    if not shards:
        raise ExportError(f"base model {base}: no *.safetensors weights to merge the adapter into")
    try:
        factors = lora_factors(*read_adapter_dir(adapter))
    except (OSError, ValueError) as e:  # MergeError is a ValueError
        raise ExportError(f"{adapter}: {e}") from None
    for shard in shards:
        with safe_open(str(shard), framework="pt") as f:
            meta = dict(f.metadata() or {})
        state = load_file(str(shard))
        for name in [n for n in state if n in factors]:
            try:
                state[name] = merge_weight(state[name], factors.pop(name))
            except MergeError as e:
                raise ExportError(f"{adapter}: {name}: {e}") from None
        with writing(out / shard.name):
            save_file(state, str(out / shard.name), metadata={**meta, "format": "pt"})
        del state
    if factors:
        raise ExportError(f"{adapter}: an adapter weight for {next(iter(factors))}, which the base model {base} "
                          f"does not have")
    for index in base.glob("*.safetensors.index.json"):
        with writing(out / index.name):
            shutil.copyfile(index, out / index.name)


def _copy_files(src: Path, dst: Path, weights: bool) -> None:
    """Every file of ``src`` (a model or adapter dir) but its README; weights only if ``weights``.
    Symlinks (the HF cache's snapshots) are copied as the files they point to."""
    for f in sorted(src.iterdir()):
        if not f.is_file() or f.name in _NOT_COPIED or (not weights and f.name.endswith(_WEIGHTS)):
            continue
        with writing(dst / f.name):
            shutil.copyfile(f, dst / f.name)


def _generation_config(out: Path) -> None:
    """The base's generation config was copied; a model without one gets its config's defaults
    (eos, bos, pad), which vLLM and ``generate`` read."""
    if (out / "generation_config.json").is_file():
        return
    from transformers import AutoConfig, GenerationConfig

    gen = GenerationConfig.from_model_config(AutoConfig.from_pretrained(str(out)))
    with writing(out / "generation_config.json"):
        gen.save_pretrained(str(out))


def check_hub(repo: str) -> None:
    """What can be told before writing: the repo id's form, and HF_HUB_OFFLINE (no network)."""
    from grpo_dist.hub import is_hub_id, offline

    if not is_hub_id(repo) or repo.startswith("pkg:"):
        raise ExportError(f"--push-to-hub: {repo!r} is not a hub repo id (user/name)")
    if offline():
        raise ExportError(f"--push-to-hub {repo}: HF_HUB_OFFLINE is set, so the hub cannot be reached: export without "
                          f"--push-to-hub and upload later (`hf upload {repo} OUT`)")


def push(out: Path, repo: str) -> str:
    """Upload ``out`` to the hub repo (made if missing, private by default): its URL; one line on failure."""
    from huggingface_hub import HfApi

    api = HfApi()
    try:
        api.create_repo(repo, exist_ok=True, private=True)
        info = api.upload_folder(folder_path=str(out), repo_id=repo, commit_message="grpo-dist export")
    except Exception as e:  # noqa: BLE001 - no network, no token, no permission: one line
        first = (str(e).strip().splitlines() or [type(e).__name__])[0][:300]
        raise ExportError(f"--push-to-hub {repo}: the upload failed ({type(e).__name__}: {first}); the export is in "
                          f"{out}: upload it later with `hf upload {repo} {out}`",
                          before_writing=False) from None
    return str(getattr(info, "commit_url", None) or f"https://huggingface.co/{repo}")


def _size(path: Path) -> str:
    n = sum(f.stat().st_size for f in path.iterdir() if f.is_file())
    return f"{n / 2**20:.1f} MiB" if n < 2**30 else f"{n / 2**30:.2f} GiB"
