"""Generation speed of the transformers rollout backend (``rollout.backend: hf``).

Compares, on the "small" model (hidden 512, 8 layers, ~25M parameters, untrained: the speed does
not depend on the weights), 8 prompts x 8 samples x 32 new tokens at temperature 1:

  old    the previous backend: one ``model.generate`` per prompt, one per *sample* with seeds
         (kept below as ``old_generate``, as it was before the batched decode loop);
  new    ``HFGenerator.generate``: one batched, left-padded decode loop with a KV cache;
  plain  one batched ``model.generate`` over all prompts (what TRL does), no per-sample seeds,
         no processed log-probs: the reference for "how fast can transformers go".

Each, with and without per-sample seeds, interleaved over ``--rounds`` rounds; medians.

    .venv/bin/python benchmarks/hf_generate.py [--threads 2] [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from grpo_dist.rollout.base import Sample, SamplingSpec  # noqa: E402
from grpo_dist.rollout.hf_engine import HFGenerator  # noqa: E402


# -- the previous implementation (HEAD before the batched loop), verbatim but for `self` -> `eng` --
@torch.no_grad()
def old_generate(eng: HFGenerator, prompt_ids, spec: SamplingSpec, seeds=None):
    tok = eng.tokenizer
    kw = dict(max_new_tokens=spec.max_tokens, pad_token_id=tok.pad_token_id if tok.pad_token_id is not None
              else tok.eos_token_id, eos_token_id=tok.eos_token_id, output_scores=True,
              return_dict_in_generate=True)
    if spec.greedy:
        kw.update(do_sample=False)
    else:
        kw.update(do_sample=True, temperature=spec.temperature, top_p=spec.top_p,
                  top_k=spec.top_k if spec.top_k > 0 else 0)
    if spec.stop:
        kw.update(stop_strings=list(spec.stop), tokenizer=tok)
    out = []
    for i, ids in enumerate(prompt_ids):
        if seeds is not None and not spec.greedy:
            samples = []
            for s in seeds[i]:
                with torch.random.fork_rng(devices=[]):
                    torch.manual_seed(s)
                    samples += _old_sample(eng, ids, 1, spec, kw)
        else:
            torch.manual_seed(int(torch.randint(0, 2**31 - 1, (1,), generator=eng._rng)))
            samples = _old_sample(eng, ids, spec.n, spec, kw)
        out.append(samples)
    return out


def _old_sample(eng: HFGenerator, ids, n, spec, kw):
    tok, eos = eng.tokenizer, eng.tokenizer.eos_token_id
    inp = torch.tensor([ids], device=eng.device)
    res = eng.model.generate(inp, attention_mask=torch.ones_like(inp), num_return_sequences=n, **kw)
    new = res.sequences[:, inp.shape[1]:]
    scores = torch.stack(res.scores, dim=1).float()
    logps = torch.log_softmax(scores, dim=-1).gather(-1, new[:, : scores.shape[1], None]).squeeze(-1)
    samples = []
    for i in range(new.shape[0]):
        seq = new[i].tolist()
        stop = len(seq)
        for j, t in enumerate(seq):
            if t == eos:
                stop = j + 1
                break
        toks = seq[:stop]
        text = tok.decode(toks, skip_special_tokens=True)
        finished = (stop < len(seq)) or (toks and toks[-1] == eos)
        hit_stop = any(s in text for s in spec.stop)
        samples.append(Sample(token_ids=toks, text=text, logprobs=logps[i, :stop].tolist(),
                              finish_reason="stop" if finished or hit_stop or len(toks) < spec.max_tokens
                              else "length"))
    return samples


@torch.no_grad()
def plain_generate(eng: HFGenerator, prompt_ids, spec: SamplingSpec, seeds=None):
    """TRL's way: left-pad all prompts, one ``generate`` with num_return_sequences=n (no seeds)."""
    tok = eng.tokenizer
    L = max(len(p) for p in prompt_ids)
    pad = tok.pad_token_id
    ids = torch.tensor([[pad] * (L - len(p)) + p for p in prompt_ids], device=eng.device)
    mask = torch.tensor([[0] * (L - len(p)) + [1] * len(p) for p in prompt_ids], device=eng.device)
    res = eng.model.generate(ids, attention_mask=mask, num_return_sequences=spec.n, do_sample=True,
                             temperature=spec.temperature, top_p=1.0, top_k=0, max_new_tokens=spec.max_tokens,
                             pad_token_id=pad, eos_token_id=tok.eos_token_id)
    return res[:, L:]


def cpu_info() -> str:
    model, flags = "?", set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name") and model == "?":
                model = line.split(":", 1)[1].strip()
            elif line.startswith("flags") and not flags:
                flags = set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return (f"{model}; avx512f={'avx512f' in flags} avx2={'avx2' in flags}; "
            f"{os.cpu_count()} logical CPUs; torch {torch.__version__}, {torch.get_num_threads()} threads")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--model-dir", default=str(ROOT / ".cache" / "bench-models" / "small-untrained-seed0"))
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    from grpo_dist.models import make_tiny_model

    if not (Path(args.model_dir) / "config.json").is_file():
        make_tiny_model(args.model_dir, size="small", seed=0, pretrain_task=None, log=None, threads=args.threads)
    torch.set_num_threads(args.threads)
    eng = HFGenerator(args.model_dir, seed=0)
    # prompts of different lengths, as a batch of arithmetic questions has
    texts = [f"{7 * i + 3}+{123 * i * i + 45}=" for i in range(args.prompts)]
    ps = eng.tokenize(texts)
    spec = SamplingSpec(n=args.n, temperature=1.0, max_tokens=args.max_tokens)
    seeds = [[1000 * i + j for j in range(args.n)] for i in range(len(ps))]
    # every row generates max_tokens: eos (sampled now and then by an untrained model) gets a -1e4 bias
    head = eng.base.lm_head
    biased = torch.nn.Linear(head.in_features, head.out_features, bias=True)
    with torch.no_grad():
        biased.weight.copy_(head.weight)
        biased.bias.zero_()
        biased.bias[eng.tokenizer.eos_token_id] = -1e4
    eng.base.lm_head = biased
    cases = [("old", "seeds", lambda: old_generate(eng, ps, spec, seeds)),
             ("new", "seeds", lambda: eng.generate(ps, spec, seeds=seeds)),
             ("old", "no seeds", lambda: old_generate(eng, ps, spec)),
             ("new", "no seeds", lambda: eng.generate(ps, spec)),
             ("plain model.generate", "no seeds", lambda: plain_generate(eng, ps, spec))]
    for _, _, fn in cases:  # warm-up
        fn()
    times: dict[tuple[str, str], list[float]] = {(a, b): [] for a, b, _ in cases}
    for _ in range(args.rounds):
        for a, b, fn in cases:
            t0 = time.perf_counter()
            fn()
            times[(a, b)].append(time.perf_counter() - t0)
    n_comp = len(ps) * args.n
    print(f"CPU: {cpu_info()}")
    print(f"model: small ({sum(p.numel() for p in eng.base.parameters()) / 1e6:.1f}M params, fp32, untrained), "
          f"{len(ps)} prompts x {args.n} samples x {args.max_tokens} new tokens, temperature 1, "
          f"{args.rounds} interleaved rounds, medians")
    print(f"{'implementation':<22} {'seeds':<9} {'seconds':>8} {'completions/s':>14} {'tokens/s':>9} {'vs plain':>8}"
          f"  {'min-max s':>13}")
    plain = statistics.median(times[("plain model.generate", "no seeds")])
    for a, b, _ in cases:
        med = statistics.median(times[(a, b)])
        print(f"{a:<22} {b:<9} {med:8.3f} {n_comp / med:14.1f} {n_comp * args.max_tokens / med:9.0f} "
              f"{med / plain:7.2f}x  {min(times[(a, b)]):6.2f}-{max(times[(a, b)]):.2f}")
    print(f"load average after the run: {os.getloadavg()[0]:.2f} (1 min): other processes on these cores skew timings")


if __name__ == "__main__":
    main()
