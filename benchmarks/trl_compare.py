"""Benchmark: TRL's GRPOTrainer vs grpo_dist on the same workload, in one invocation, interleaved.

    python benchmarks/trl_compare.py [--steps 20 --skip 2 --rounds 2] [--settings trl,trl_vllm,sync,async]
        [--model untrained|add|smollm2|calculator] [--json out.json] [--section.key VALUE ...]

(``make bench-trl ARGS="..."`` installs the ``bench`` extra, i.e. TRL, first.)

The workload: the locally generated "small" Llama (hidden 512, 8 layers, ~24M
parameters, character vocabulary; cached under .cache/bench_models/), the builtin ``add`` prompts,
8 prompts x 8 completions = one 64-completion micro-batch per step, at most 32 new tokens at
temperature 1, LoRA r=8 (alpha 16) on q,k,v,o, KL beta 0.04, fp32, AdamW lr 1e-4 (constant), one
update per batch, the ``correctness`` reward (grpo_dist's builtin, which has TRL's reward
signature: the same function in every setting). ``--model untrained`` (default) generates close to
32 tokens per completion (EOS is ~1/104 per token); the ``add``-pretrained model answers in ~3
tokens and stops, which makes a short, latency-bound workload. Nothing forces the length: every
setting samples the same model, so tokens/s is the measure to compare, completions/s next to it.

``--model smollm2``, the real-model workload: SmolLM2-135M-Instruct
(``pkg:smollm2-135m-instruct``), the chat word problems of configs/smollm2_cpu.yaml (its base
config here), 64 new tokens, LoRA r=16 (alpha 32) on q,k,v,o,gate,up,down, the ``math`` reward,
lr 2e-4, micro-batches of 8 (8 accumulated per step) in both systems; TRL gets grpo_dist's very
prompts in its stream's order (trl_bench/workloads.py ``prompt_rows``) and its algorithm
settings. Settings by default: trl, trl_bf16w, sync, sync_bf16all (the small workload: all but
sync_bf16all and stream).

``--model calculator``, multi-turn tool use: TRL's ``GRPOTrainer(tools=[calculator])``
against grpo_dist's ``rollout.env: calculator`` (configs/calculator_smollm2.yaml), the same
``calculator`` function, SmolLM2-135M-Instruct with its ChatML template extended to render
tool calls, in both (TRL's tool loop needs a template that renders them and a parser of them;
trl_bench/tool_workload.py), the same opening ids (the recipe's short call format and one worked
call) for grpo_dist's prompts in its order, <= 3 turns (TRL: max_tool_calling_iterations 2), <= 192 tokens a trajectory (TRL's
max_completion_length = rollout.max_total_tokens; no per-turn cap, a turn ends at EOS), T 0.7,
LoRA r=16 on all projections, beta 0, lr 5e-4, fp32; the reward: the final answer's last number
(TRL: a function; grpo_dist: env_reward). Settings by default: trl, sync (lock-step turns), stream
(``rollout.streaming``: each trajectory on its own). The table reports trajectories/s, sampled
tokens/s (tool results left out, as TRL counts), turns and tool calls per trajectory.

Settings, run ``--rounds`` times in turn (round 1: all settings, round 2: all settings, ...):
  trl       TRL GRPOTrainer, its default generation (transformers ``generate``)
  trl_vllm  TRL with ``use_vllm=True, vllm_mode="colocate"`` (vLLM in the training process)
  sync      grpo_dist, trainer.max_staleness 0, 1 vLLM worker (real local Ray cluster, DeepSpeed)
  async     grpo_dist, trainer.max_staleness 1 (generation one step ahead), 1 vLLM worker
  stream    sync with rollout.streaming true (vLLM's async engine; multi-turn: no lock step)
  sync_bf16all  sync with model.dtype bfloat16 (engine and learner in bfloat16)
  defaults  grpo_dist at its defaults: model.dtype auto (a bfloat16 learner on a CPU with AVX512_BF16
            or AMX; engines merging the adapter keep float32), trainer.max_staleness auto
  sync2     sync with 2 vLLM workers (each engine bound to its own cores: 1 each on 2 cores)
  async2    async with 2 vLLM workers
  sync2_bf16  sync2 with rollout.dtype bfloat16: the engines generate from bfloat16 weights, the
            learner stays float32
  sync2_bf16all  sync2 with model.dtype bfloat16: engines and learner in bfloat16 (DeepSpeed bf16)
  sync2_c   sync2 with rollout.enforce_eager false (below)
  sync2_bf16all_c  sync2_bf16all with rollout.enforce_eager false: vLLM compiles its CPU model
            (torch.compile, inductor's C++ backend; ~40 s more start-up for two engines on 2 cores)
  trl_bf16  TRL with bf16=True (autocast to bfloat16 over the float32 weights)
  trl_bf16w TRL with the model loaded in bfloat16 and bf16=True
The bf16 settings are not the issue's fp32 workload: the ratios are printed against the fastest TRL
setting and against the fastest TRL setting of the same precision (fp32 or bf16).
Without TRL installed, the TRL settings are skipped with a printed line.
Each TRL run is a fresh subprocess (clean memory and thread state; torch threads =
``--trl-threads``, default all cores); a failing setting is reported with its error line instead
of stopping the benchmark. grpo_dist runs in this process like benchmarks/pipeline.py, from
``--config`` (configs/tiny_cpu.yaml) plus the workload's overrides plus any extra
``--section.key VALUE`` given here (grpo_dist settings only; they win over the workload's).

Reported per setting: medians over the steps after ``--skip`` (pooled over the rounds; the
per-round medians too) of s/step, completions/s, completion tokens/s and the time per stage:
generate (grpo_dist async: the generation wait the update did not hide), the no-grad log-prob
passes (KL reference; TRL with vLLM also recomputes old log-probs for its importance sampling),
the update (forward + backward + optimizer), weight sync, reward; then the ratio of each
grpo_dist setting to the fastest TRL setting, the CPU model and flags, torch threads, versions
and the load average before and after each run; and each stage's distance from its compute floor
(generate, reference, update: measured s / (the stage's FLOPs / this machine's matmul roof at the
stage's precision); trl_bench/floors.py) with the learner's own perf/learner_tflops and perf/mfu.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # trl_bench/, next to this file

from trl_bench.floors import best_roofs, floor_context, measure_roofs  # noqa: E402
from trl_bench.machine import (  # noqa: E402
    busy_since, cpu_info, cpu_jiffies, git_state, loadavg, uptime, versions, wait_idle)
from trl_bench.report import ratios, render, step_stats, summarise, table  # noqa: E402,F401
from trl_bench.runners import error_line, run_grpo, run_trl, trl_worker  # noqa: E402,F401
from trl_bench.workloads import (  # noqa: E402,F401
    DEFAULT_SETTINGS, MODEL_CACHE, MODELS, ROOT, SETTINGS, STAGES, WORKLOAD, WORKLOADS, ensure_model, grpo_overrides,
    model_dir, precision, prompt_rows, resize, stage_precision, trl_args, workload_of)


# ----------------------------------------------------------------------------- main

def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 epilog="Unknown --section.key VALUE pairs override the grpo_dist config "
                                        "(grpo_dist settings only), e.g. --cluster.torch_threads 2.")
    ap.add_argument("--config", default=None,
                    help="grpo_dist base config (the workload's overrides go on top; default configs/tiny_cpu.yaml, "
                         "for --model smollm2 configs/smollm2_cpu.yaml, calculator configs/calculator_smollm2.yaml)")
    ap.add_argument("--steps", type=int, default=20, help="training steps per run")
    ap.add_argument("--skip", type=int, default=2, help="warm-up steps of each run left out of the medians")
    ap.add_argument("--rounds", type=int, default=2, help="times every setting runs, interleaved")
    ap.add_argument("--settings", default=None,
                    help=f"comma-separated, of {', '.join(SETTINGS)} (default: the small workload all but "
                         f"sync_bf16all and stream; smollm2 {','.join(DEFAULT_SETTINGS['smollm2'])}; calculator "
                         f"{','.join(DEFAULT_SETTINGS['calculator'])})")
    ap.add_argument("--model", choices=MODELS, default="untrained",
                    help="the small Llama untrained (near-full-length completions) or pretrained on add, or "
                         "smollm2: SmolLM2-135M-Instruct on the chat word problems (the real-model workload), or "
                         "calculator: SmolLM2 calling a calculator tool over up to 3 turns (TRL's tool loop)")
    ap.add_argument("--prompts", type=int, default=None, help="prompts per step, both systems (default: the workload's 8)")
    ap.add_argument("--group", type=int, default=None, help="completions per prompt, both systems (default: 8)")
    ap.add_argument("--trl-threads", type=int, default=os.cpu_count() or 1, help="torch threads of the TRL runs")
    ap.add_argument("--trl-gradient-checkpointing", action="store_true",
                    help="keep TRL's default gradient_checkpointing=True (off by default here, like grpo_dist)")
    ap.add_argument("--trl-timeout", type=float, default=3600.0, help="seconds before a TRL run is stopped")
    ap.add_argument("--wait-idle", type=float, default=None, metavar="FRAC",
                    help="before each run wait until the machine is less than FRAC busy (other jobs), e.g. 0.3")
    ap.add_argument("--wait-max", type=float, default=600.0, help="seconds --wait-idle waits at most per run")
    ap.add_argument("--quiet", type=float, default=0.1, metavar="FRAC",
                    help="the second table takes only the steps during which other processes used less than "
                         "FRAC of the machine's CPU time")
    ap.add_argument("--json", default=None, help="also write the results to this file")
    ap.add_argument("--report", default=None, metavar="JSON",
                    help="print the report of an earlier --json (with this --skip/--quiet) and exit")
    ap.add_argument("--log-dir", default=None, help="TRL run logs (default: a temporary directory)")
    ap.add_argument("--dry-run", action="store_true", help="print the plan (settings, overrides) and exit")
    ap.add_argument("--_trl-worker", nargs=2, dest="trl_worker", metavar=("SPEC", "OUT"), help=argparse.SUPPRESS)
    return ap


def parse(argv: list[str] | None = None) -> tuple[argparse.Namespace, list[str]]:
    ap = build_parser()
    args, extra = ap.parse_known_args(argv)
    if args.trl_worker:
        return args, extra
    args.workload = workload_of(args.model)
    if (args.prompts is not None and args.prompts < 1) or (args.group is not None and args.group < 2):
        ap.error("--prompts must be >= 1 and --group >= 2")
    resize(args.workload, args.prompts, args.group)
    if args.config is None:
        args.config = os.path.join(ROOT, WORKLOADS[args.workload]["config"])
    if args.settings is None:
        args.settings = ",".join(DEFAULT_SETTINGS[args.workload])
    names = [s.strip() for s in args.settings.split(",") if s.strip()]
    bad = [s for s in names if s not in SETTINGS]
    if bad or not names:
        ap.error(f"--settings: unknown {bad}; choose from {', '.join(SETTINGS)}")
    args.settings = names
    if args.steps < 1 or args.rounds < 1:
        ap.error("--steps and --rounds must be >= 1")
    if args.skip >= args.steps:
        ap.error("--skip must be smaller than --steps")
    from grpo_dist.config import ConfigError, load_config

    try:  # a bad override fails here, in a second, not after the TRL runs
        load_config(args.config, grpo_overrides(model_dir(args.model), args.steps, 0, tempfile.gettempdir(), extra,
                                                workload=args.workload))
    except ConfigError as e:
        ap.error(f"grpo_dist config ({os.path.relpath(args.config, ROOT)} + overrides): {e}")
    return args, extra


def main(argv: list[str] | None = None) -> int:
    args, extra = parse(argv)
    if args.trl_worker:
        return trl_worker(*args.trl_worker)
    if args.report:
        with open(args.report) as f:
            doc = json.load(f)
        if "--skip" in (argv if argv is not None else sys.argv[1:]):
            doc["skip"] = args.skip
        print(render(doc, args.quiet))
        return 0
    wl = args.workload
    plan = [(r, s) for r in range(args.rounds) for s in args.settings]
    if args.dry_run:
        print(json.dumps({"plan": plan, "model": model_dir(args.model), "workload": WORKLOADS[wl],
                          "config": os.path.relpath(args.config, ROOT),
                          "grpo_overrides": grpo_overrides(model_dir(args.model), args.steps, 0, "OUT", extra,
                                                           workload=wl),
                          "trl": {s: {"weights": SETTINGS[s].get("weights", "float32"), "GRPOConfig": trl_args(dict(
                              out_dir="OUT", steps=args.steps, use_vllm=SETTINGS[s]["use_vllm"], workload=wl,
                              bf16=SETTINGS[s].get("trl_bf16", False),
                              gradient_checkpointing=args.trl_gradient_checkpointing))}
                              for s in args.settings if SETTINGS[s]["kind"] == "trl"}},
                         indent=1))
        return 0
    from grpo_dist.util.procenv import setup_env

    setup_env()
    cpu, vers = cpu_info(), versions()
    trl = [s for s in args.settings if SETTINGS[s]["kind"] == "trl"]
    if trl and vers["trl"] == "not installed":
        print(f"[trl_compare] TRL is not installed: skipping {', '.join(trl)} (`make bench-trl` installs the "
              f"bench extra)", flush=True)
        args.settings = [s for s in args.settings if s not in trl]
        plan = [(r, s) for r, s in plan if s not in trl]
        if not args.settings:
            return 2
    model = ensure_model(args.model)
    roofs_before = measure_roofs()
    floor = floor_context(wl, model, args.steps, roofs_before)
    log_dir = args.log_dir or tempfile.mkdtemp(prefix="trl_compare_logs_")
    os.makedirs(log_dir, exist_ok=True)
    started, up_start, tree = time.strftime("%Y-%m-%d %H:%M:%S %Z"), uptime(), git_state()
    runs: dict[str, list[dict[str, Any]]] = {s: [] for s in args.settings}
    for r, name in plan:
        waited = {}
        if args.wait_idle is not None:
            busy, secs = wait_idle(args.wait_idle, args.wait_max)
            waited = {"busy_before": busy, "waited_s": secs}
        load_before, mark = loadavg(), cpu_jiffies()
        print(f"[trl_compare] round {r + 1}/{args.rounds}: {name} ({args.steps} steps; load {load_before}"
              + (f"; waited {waited['waited_s']:.0f} s, machine {waited['busy_before']:.0%} busy" if waited else "")
              + ")", flush=True)
        if SETTINGS[name]["kind"] == "trl":
            round_dir = os.path.join(log_dir, f"r{r + 1}")
            os.makedirs(round_dir, exist_ok=True)
            res = run_trl(name, model, args.steps, args.trl_threads, args.trl_gradient_checkpointing, round_dir,
                          args.trl_timeout, workload=wl)
        else:
            res = run_grpo(name, args.config, model, args.steps, extra, workload=wl)
        res.update(round=r + 1, load_before=load_before, load_after=loadavg(), machine_busy=busy_since(mark), **waited)
        runs[name].append(res)
        if "error" in res:
            print(f"[trl_compare]   {name} failed: {res['error']}", flush=True)
        else:
            st = [x["step_s"] for x in res["steps"][args.skip:]]
            print(f"[trl_compare]   {name}: median {statistics.median(st):.2f} s/step (wall {res['wall_s']:.0f} s, "
                  f"machine {res['machine_busy']:.0%} busy, load after {res['load_after']})", flush=True)
    roofs_after = measure_roofs()
    floor.update(roofs=best_roofs(roofs_before, roofs_after), roofs_before=roofs_before, roofs_after=roofs_after)
    doc = {"started": started, "uptime_start": up_start, "uptime_end": uptime(), "grpo_dist_tree": tree,
           "argv": sys.argv[1:], "steps": args.steps, "skip": args.skip, "rounds": args.rounds, "model": args.model,
           "workload": WORKLOADS[wl], "floor": floor, "extra": extra, "cpu": cpu, "versions": vers, "trl_threads": args.trl_threads,
           "trl_gradient_checkpointing": args.trl_gradient_checkpointing, "settings": args.settings, "runs": runs,
           "log_dir": log_dir}
    print()
    print(render(doc, args.quiet))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=1)
        print(f"JSON: {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
