"""The model card (``README.md``) of ``grpo-dist export``: what the model is, the held-out table
before/after training (``summary.json``), how it was trained (steps, date, the code's version and
commit and the machine from ``run.json``), how to load it, and the recipe (``config.yaml``)."""

from __future__ import annotations

import datetime
from pathlib import Path
from typing import Any

_METRICS = ("sampled_accuracy", "greedy_accuracy", "mean_reward", "greedy_mean_reward")


def _rows(rep: dict[str, Any]) -> list[str]:
    pass_k = sorted((k for k in rep if k.startswith("pass@")), key=lambda k: int(k[5:]))
    return [k for k in _METRICS[:2] if k in rep] + pass_k + [k for k in _METRICS[2:] if k in rep]


def results_table(before: dict[str, Any] | None, after: dict[str, Any] | None) -> list[str]:
    """Markdown rows: metric | before | after | change (the held-out evaluations of a summary)."""
    ref = after or before
    if not ref:
        return []
    lines = ["| metric | before | after | change |", "|---|---:|---:|---:|"]
    for key in _rows(ref):
        b, a = (before or {}).get(key), (after or {}).get(key)
        fig = lambda v: f"{v:.3f}" if isinstance(v, (int, float)) else "-"  # noqa: E731
        change = f"{a - b:+.3f}" if isinstance(a, (int, float)) and isinstance(b, (int, float)) else "-"
        lines.append(f"| {key} | {fig(b)} | {fig(a)} | {change} |")
    return lines


def _held_out(summary: dict[str, Any], eval_path: str | None) -> list[str]:
    before, after = summary.get("eval_before"), summary.get("eval_after")
    if not (before or after):
        return ["No held-out evaluation in the run's summary.json (trainer.eval_before_after off, or an unfinished "
                "run)."]
    ref = after or before
    where = (f"{ref.get('num_prompts', '?')} held-out prompts ({eval_path or 'data.eval_path'}), "
             f"{ref.get('samples_per_prompt', '?')} samples each at temperature {ref.get('temperature', '?')}; "
             f"greedy: one answer at temperature 0.")
    out = [where, "", *results_table(before, after)]
    if not after:
        out += ["", "Not evaluated after training (a checkpoint, or trainer.eval_before_after off at the end): "
                "`grpo-dist eval --adapter` measures it."]
    for name in sorted((after or before).get("extra", {})):
        out += ["", f"Held-out set `{name}`:", "",
                *results_table((before or {}).get("extra", {}).get(name), (after or {}).get("extra", {}).get(name))]
    return out


def _machine(info: dict[str, Any]) -> str:
    m = info.get("machine")
    if not m:
        return "not recorded (run.json from before grpo-dist recorded it)"
    gpus = m.get("gpus") or []
    gpu = f", {len(gpus)} x {gpus[0]}" if gpus and len(set(gpus)) == 1 else (", " + ", ".join(gpus) if gpus else "")
    return f"{m.get('cpu') or 'CPU'} ({m.get('cpus', '?')} logical CPUs){gpu}, {m.get('os', '')}".rstrip(", ")


def _code(info: dict[str, Any]) -> str:
    c = info.get("code") or {}
    if not c:
        return "not recorded"
    commit = c.get("commit")
    return (f"grpo_dist {c.get('grpo_dist', '?')}"
            + (f", commit {commit}{' with uncommitted changes' if c.get('dirty') else ''}" if commit else
               ", commit not recorded (not run from a git checkout)"))


def _what(run, kind: str, base_name: str, base_dir: Path | None) -> str:
    ac = run.adapter_config
    lora = (f"LoRA r={ac.get('r')}, alpha={ac.get('lora_alpha')} on "
            f"{', '.join(sorted(ac.get('target_modules') or [])) or '?'}")
    if kind == "merged":
        dtype = _dtype(base_dir)
        return (f"`{base_name}` fine-tuned with GRPO by grpo-dist: the run's {lora} merged into the base weights"
                f"{f' ({dtype})' if dtype else ''}. A plain transformers model: transformers and vLLM load it without "
                f"PEFT.")
    if kind == "adapter":
        return (f"A {lora} adapter (PEFT) for `{base_name}`, trained with GRPO by grpo-dist. The base model is not "
                f"included: load it and apply the adapter (below).")
    return f"`{base_name}` fine-tuned with GRPO by grpo-dist (full weights)."


def _dtype(base_dir: Path | None) -> str:
    import json

    try:
        conf = json.loads((base_dir / "config.json").read_text()) if base_dir else {}
    except (OSError, ValueError):
        return ""
    return str(conf.get("dtype") or conf.get("torch_dtype") or "")


def _use(kind: str, base_name: str, dtype: str) -> list[str]:
    if kind == "adapter":
        return ["```python", "from peft import PeftModel", "from transformers import AutoModelForCausalLM, AutoTokenizer",
                "", f'base = AutoModelForCausalLM.from_pretrained("{base_name}")',
                'model = PeftModel.from_pretrained(base, "<this directory>")',
                f'tokenizer = AutoTokenizer.from_pretrained("{base_name}")', "```", "",
                f"vLLM: `vllm serve {base_name} --enable-lora --lora-modules grpo=<this directory>`."]
    return ["```python", "from transformers import AutoModelForCausalLM, AutoTokenizer", "",
            'model = AutoModelForCausalLM.from_pretrained("<this directory>")',
            'tokenizer = AutoTokenizer.from_pretrained("<this directory>")', "```", "",
            f"vLLM: `vllm serve <this directory>{' --dtype float32' if dtype == 'float32' else ''}` (the chat "
            f"template and generation config are here"
            + ("; vLLM's default dtype would serve these float32 weights in 16 bits)." if dtype == "float32" else ").")]


def model_card(run, kind: str, base_dir: Path | None = None) -> str:
    """The card of an export of ``run`` (``export.RunFiles``); ``kind``: merged, adapter or full."""
    from grpo_dist.hub import is_hub_id

    s, info = run.summary, run.run_info
    hub_base = run.base if (kind != "full" and is_hub_id(run.base) and not run.base.startswith("pkg:")) else None
    base_name = hub_base or (Path(run.base).name if kind != "full" else _config_get(run.config_text, "model", "path") or "the base")
    front = ["---", *([f"base_model: {hub_base}"] if hub_base else []),
             f"library_name: {'peft' if kind == 'adapter' else 'transformers'}",
             "tags:", "- grpo", "- grpo-dist", *(["- lora"] if kind != "full" else []), "---", ""]
    today = datetime.datetime.now(datetime.timezone.utc).date().isoformat()
    finished = _finished(run)
    steps = s.get("steps")
    trained = [f"- steps: {steps if steps is not None else 'not recorded'}"
               + (f", {s['wall_seconds'] / 60:.1f} min" if isinstance(s.get("wall_seconds"), (int, float)) else "")
               + (f" over {s['segments']} segments" if s.get("segments", 1) > 1 else ""),
               f"- run id: {info.get('run_id', 'not recorded')}",
               f"- trained: {finished or 'not recorded'}; exported: {today}",
               f"- code: {_code(info)}",
               f"- machine (the driver's): {_machine(info)}",
               f"- base model: `{run.base}`"]
    recipe = ["```yaml", run.config_text.rstrip(), "```"] if run.config_text else ["(no config.yaml in the run dir)"]
    return "\n".join([*front, f"# {base_name} + GRPO ({kind})", "", _what(run, kind, base_name, base_dir), "",
                      "## Held-out results", "", *_held_out(s, _config_get(run.config_text, "data", "eval_path")), "", "## Training", "", *trained, "",
                      "## Use", "", *_use(kind, hub_base or run.base, _dtype(base_dir or run.adapter)), "",
                      "## Recipe", "", "The run's resolved config (`config.yaml`; "
                      "`grpo-dist train --config config.yaml` trains it again):", "", *recipe, ""])


def _finished(run) -> str | None:
    f = run.home / "summary.json"
    if not f.is_file():
        return None
    return datetime.datetime.fromtimestamp(f.stat().st_mtime, datetime.timezone.utc).date().isoformat()


def _config_get(text: str, section: str, key: str) -> str | None:
    """``section.key`` of the run's config.yaml (None where it has none)."""
    import yaml

    try:
        return str(((yaml.safe_load(text) or {}).get(section) or {}).get(key) or "") or None
    except (yaml.YAMLError, AttributeError):
        return None
