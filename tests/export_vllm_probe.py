"""vLLM's greedy answers from a model directory, as a user serving an export gets them: `python
tests/export_vllm_probe.py MODEL_DIR PROMPTS_JSON` prints one JSON line, the completion token ids
of each prompt (a list of token-id lists). Its own process (vLLM's CPU engine, in process:
``in_process_llm``), so pytest's process loads no vLLM plugin and holds no engine memory."""

from __future__ import annotations

import json
import os
import sys


def main() -> None:
    model, prompts_file = sys.argv[1], sys.argv[2]
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    from vllm import SamplingParams, TokensPrompt

    from grpo_dist.rollout.vllm_engine import in_process_llm

    spec = json.loads(open(prompts_file).read())
    # the model's own dtype: vLLM's "auto" serves a float32 model in 16 bits (the card says --dtype float32)
    dtype = json.loads(open(os.path.join(model, "config.json")).read()).get("dtype", "auto")
    llm = in_process_llm({"model": model, "max_model_len": spec["max_model_len"], "enforce_eager": True,
                          "dtype": dtype})
    outs = llm.generate([TokensPrompt(prompt_token_ids=ids) for ids in spec["prompt_ids"]],
                        SamplingParams(temperature=0.0, max_tokens=spec["max_tokens"]), use_tqdm=False)
    print(json.dumps([list(o.outputs[0].token_ids) for o in outs]), flush=True)
    del llm


if __name__ == "__main__":
    main()
