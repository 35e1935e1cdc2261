"""The report: medians per setting, the markdown tables, the ratios to the fastest TRL setting."""

from __future__ import annotations

import statistics
from typing import Any

from trl_bench.floors import STAGE_FLOPS, annotate, describe
from trl_bench.workloads import SETTINGS, STAGES, precision

# the floor columns: (key in the step records, header); present when the run measured the roofs
FLOOR_COLS = [(f"{k}_x", h) for k, h in (("generate", "generate x floor"), ("ref_logp", "ref x floor"),
                                           ("update", "update x floor")) if k in STAGE_FLOPS]


def _median(vals: list[float]) -> float:
    vals = [v for v in vals if v == v]  # drop NaN
    return statistics.median(vals) if vals else float("nan")


def step_stats(steps: list[dict[str, float]]) -> dict[str, float]:
    """Medians of one set of step records (per-step rates, then their median)."""
    s = {"steps": len(steps), "s_per_step": _median([x["step_s"] for x in steps]),
         "completions_per_s": _median([x["completions"] / x["step_s"] for x in steps]),
         "tokens_per_s": _median([x["tokens"] / x["step_s"] for x in steps])}
    for key in (["completion_len", "turns", "tool_calls", "reward", "others_cpu", "own_cpu", "learner_tflops", "mfu"] + [k for k, _ in STAGES]
                + [k for k, _ in FLOOR_COLS] + [k.replace("_x", "_floor_s") for k, _ in FLOOR_COLS]):
        s[key] = _median([x.get(key, float("nan")) for x in steps])
    return s


def summarise(runs: list[dict[str, Any]], skip: int, quiet: float | None = None) -> dict[str, Any]:
    """Medians over the measured steps (after ``skip``) of every run of one setting, pooled; with
    ``quiet``, also over the steps during which other processes used less than that fraction of the
    machine (``"quiet"``)."""
    ok = [r for r in runs if "error" not in r and len(r.get("steps", [])) > skip]
    if not ok:
        errs = [r.get("error", "no measured steps") for r in runs]
        return {"error": errs[-1] if errs else "not run"}
    pooled = [x for r in ok for x in r["steps"][skip:]]
    out = step_stats(pooled)
    out["per_round"] = [step_stats(r["steps"][skip:]) for r in ok]
    if quiet is not None:
        out["quiet"] = step_stats([x for x in pooled if x.get("others_cpu", float("nan")) < quiet])
    out["setup_s"] = [r.get("setup_s") for r in ok]
    out["threads"] = ok[0].get("threads")
    out["learner_roof_tflops"], out["learner_threads"] = ok[0].get("learner_roof_tflops"), ok[0].get("learner_threads")
    out["machine_busy"] = [round(r.get("machine_busy", float("nan")), 3) for r in ok]
    out["load_before"] = [r.get("load_before") for r in ok]
    if len(ok) < len(runs):
        out["failed_rounds"] = [r["error"] for r in runs if "error" in r]
    return out


def fmt(v: Any, nd: int = 2) -> str:
    return "n/a" if not isinstance(v, (int, float)) or v != v else f"{v:.{nd}f}"


def _view(s: dict[str, Any], quiet: bool) -> dict[str, Any] | None:
    if "error" in s:
        return None
    v = s.get("quiet") if quiet else s
    return v if v and v.get("steps") else None


def table(summary: dict[str, dict[str, Any]], rounds: int, quiet: bool = False, floors: bool = False) -> str:
    """The markdown table: all measured steps (per-round medians in parentheses), or with
    ``quiet`` only the steps that other processes left (nearly) alone; with ``floors`` each
    stage's measured / floor (trl_bench/floors.py)."""
    fcols = FLOOR_COLS if floors else []
    # multi-turn (a setting reports turns): trajectories, the sampled tokens, turns and tool calls per trajectory
    multi = any(v is not None and v.get("turns", float("nan")) == v.get("turns") for v in
                (_view(s, quiet) for s in summary.values()))
    head = (["setting", "steps", "s/step"] + (["trajectories/s", "sampled tokens/s", "sampled tokens/traj",
                                               "turns/traj", "tool calls/traj"] if multi else
                                              ["completions/s", "tokens/s", "mean len"])
            + [h for _, h in STAGES] + [h for _, h in fcols] + ["torch threads", "others' CPU"])
    lines = ["| " + " | ".join(head) + " |", "|---" * len(head) + "|"]
    for name, s in summary.items():
        label, v = SETTINGS[name]["label"], _view(s, quiet)
        if "error" in s:
            lines.append(f"| {label} | failed: {s['error'].replace('|', '/')} |" + " |" * (len(head) - 2))
            continue
        if v is None:
            lines.append(f"| {label} | 0 |" + " |" * (len(head) - 2))
            continue

        def both(key: str, nd: int = 2) -> str:  # pooled median, then the per-round medians
            txt = fmt(v[key], nd)
            if not quiet and rounds > 1 and len(s["per_round"]) > 1:
                txt += " (" + " / ".join(fmt(r[key], nd) for r in s["per_round"]) + ")"
            return txt

        row = [label, str(v["steps"]), both("s_per_step"), both("completions_per_s"), both("tokens_per_s", 0),
               fmt(v["completion_len"], 1)] + ([fmt(v["turns"]), fmt(v["tool_calls"])] if multi else [])
        row += [fmt(v[k]) for k, _ in STAGES] + [fmt(v[k], 1) for k, _ in fcols] + [str(s.get("threads")), f"{v['others_cpu']:.0%}"
                                                 if v["others_cpu"] == v["others_cpu"] else "n/a"]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def ratios(summary: dict[str, dict[str, Any]], quiet: bool = False,
           same_precision: bool = False) -> tuple[str | None, list[str], dict[str, Any]]:
    """Each grpo_dist setting against the TRL setting with the most tokens/s: of all TRL settings,
    or (``same_precision``) of those with the grpo_dist setting's precision (fp32 / bf16)."""
    trl = {n: _view(s, quiet) for n, s in summary.items() if SETTINGS[n]["kind"] == "trl"}
    trl = {n: v for n, v in trl.items() if v is not None}
    if not trl:
        return None, ["no TRL steps" + (" in this view" if quiet else "") + ": no ratios"], {}
    best = max(trl, key=lambda n: trl[n]["tokens_per_s"])
    lines, out = [], {}
    for n, s in summary.items():
        v = _view(s, quiet)
        if SETTINGS[n]["kind"] != "grpo" or v is None:
            continue
        ref = best
        if same_precision:
            peers = [t for t in trl if precision(t) == precision(n)]
            if not peers:
                continue
            ref = max(peers, key=lambda t: trl[t]["tokens_per_s"])
        b = trl[ref]
        r = {"completions_per_s": v["completions_per_s"] / b["completions_per_s"],
             "tokens_per_s": v["tokens_per_s"] / b["tokens_per_s"], "s_per_step": v["s_per_step"] / b["s_per_step"],
             "against": ref}
        out[n] = r
        lines.append(f"{SETTINGS[n]['label']}: {r['tokens_per_s']:.2f}x the tokens/s, {r['completions_per_s']:.2f}x "
                     f"the completions/s, {r['s_per_step']:.2f}x the s/step of {SETTINGS[ref]['label']}")
    return best, lines, out



def render(doc: dict[str, Any], quiet: float) -> str:
    """The report of a run (``doc`` as written to --json; its ``summary`` and ratios filled in here)."""
    skip, rounds = doc["skip"], doc["rounds"]
    floor = doc.get("floor")
    if floor:
        for s in doc["settings"]:
            for r in doc["runs"][s]:
                annotate(r.get("steps", []), s, floor)
    summary = {s: summarise(doc["runs"][s], skip, quiet) for s in doc["settings"]}
    best, ratio_lines, ratio_map = ratios(summary)
    q_best, q_lines, q_map = ratios(summary, quiet=True)
    _, same_lines, same_map = ratios(summary, same_precision=True)
    doc.update(summary=summary, quiet=quiet, fastest_trl=best, ratios_vs_fastest_trl=ratio_map,
               ratios_vs_fastest_trl_same_precision=same_map,
               quiet_fastest_trl=q_best, quiet_ratios_vs_fastest_trl=q_map)
    cpu = doc["cpu"]
    grpo_threads = next((s.get("threads") for n, s in summary.items() if SETTINGS[n]["kind"] == "grpo" and "threads" in s), "n/a")
    w = doc.get("workload", {})
    model = {"smollm2": "SmolLM2-135M-Instruct", "calculator": "SmolLM2-135M-Instruct, tool-call chat template"
             }.get(doc["model"], f"small-{doc['model']}")
    tokens = (f"<= {w['max_turns']} turns (the {w['env']} tool), <= {w['max_total_tokens']} tokens a trajectory, "
              f"T {w.get('temperature', 1.0)}" if "env" in w else f"<= {w.get('max_tokens', 32)} new tokens")
    out = [f"{doc['steps']} steps x {rounds} round(s), medians of steps {skip + 1}-{doc['steps']} (pooled; per round "
           f"in parentheses); model {model}; {w.get('data', 'builtin:add')}; {w.get('prompts', 8)} prompts x "
           f"{w.get('group', 8)} completions, {tokens}; times in s; "
           f"others' CPU = share of the machine other processes used during the steps",
           table(summary, rounds, floors=bool(floor))]
    if floor:
        out += [describe(floor)]
        out += [f"{n}: perf/learner_tflops {fmt(v['learner_tflops'] * 1e3, 1)} GFLOP/s, perf/mfu {fmt(v['mfu'], 3)} "
                f"(the learner's own roof: {fmt((s.get('learner_roof_tflops') or float('nan')) * 1e3, 0)} GFLOP/s "
                f"with {s.get('learner_threads')} threads)"
                for n, s in summary.items() if (v := _view(s, False)) is not None and SETTINGS[n]["kind"] == "grpo"]
    out += ["", "Against the fastest TRL setting:", *ratio_lines, "",
           "Against the fastest TRL setting of the same precision (fp32 / bf16):", *same_lines, "",
           f"Only the steps during which other processes used < {quiet:.0%} of the machine:",
           table(summary, rounds, quiet=True, floors=bool(floor)), "", *q_lines, "",
           f"CPU: {cpu['model']}, {cpu['cores']} cores, avx2={'yes' if cpu['avx2'] else 'no'}, avx512f="
           f"{'yes' if cpu['avx512f'] else 'no'}, avx512_bf16={ {True: 'yes', False: 'no'}.get(cpu.get('avx512_bf16'), '?')}, "
           f"amx={'yes' if cpu['amx'] else 'no'}; torch threads: TRL "
           f"{doc['trl_threads']}, grpo_dist cluster.torch_threads {grpo_threads}"
           + ("; TRL gradient_checkpointing on" if doc.get("trl_gradient_checkpointing") else ""),
           "versions: " + ", ".join(f"{k} {v}" for k, v in doc["versions"].items()),
           f"grpo_dist tree: {doc['grpo_dist_tree']}",
           f"started {doc['started']}; at start: {doc['uptime_start']}; at the end: {doc['uptime_end']}"]
    chosen = sorted({c for n in doc["settings"] for r in doc["runs"][n] for c in r.get("choices", [])})
    if chosen:
        out.append("grpo_dist defaults chosen for this machine: " + "; ".join(chosen))
    if doc.get("extra"):
        out.append(f"grpo_dist overrides: {' '.join(doc['extra'])}")
    return "\n".join(out)
