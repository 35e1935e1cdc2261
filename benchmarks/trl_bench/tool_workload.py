"""The ``calculator`` workload: multi-turn tool use, grpo_dist's calculator environment
against TRL's ``GRPOTrainer(tools=[calculator])`` on the same model, prompts and tool.

TRL's tool loop needs a chat template that renders ``tool_calls`` (``supports_tool_calling``) and
a parser of the model's calls (``add_response_schema`` sets one for templates it knows by their
exact text); SmolLM2-135M-Instruct's own ChatML template renders no ``tool_calls``. So both systems
get a copy of the converted SmolLM2 model (weights symlinked) with another chat template
(``make_tool_model``, ``template_text``): by default :data:`CHATML_TOOLS`, SmolLM2's ChatML that
also renders ``tool_calls`` the way Qwen2.5 does. Qwen2.5's own template (``qwen2_5.jinja`` here,
byte-identical to TRL 1.16's, which TRL recognises) made the 135M model write the
``<tool_response>`` itself instead of calling: 0 calls in 48 trajectories with its JSON-schema
tools block, 1 in 48 without it, in either system. For any template but Qwen2.5's own, TRL's
worker sets TRL's parser of Qwen2.5 calls (``qwen3_template``, what ``add_response_schema`` picks
for Qwen2.5) on the tokenizer itself, as TRL asks of a template it does not know. grpo_dist's
pre-flight accepts these templates (prefix-preserving).

Both systems open every trajectory with the same ids: ``CalculatorEnv(few_shot=True).reset(record)``
(configs/calculator_smollm2.yaml's prompt: the short call format and one worked call, then the
question with " Use the calculator."), for the records of grpo_dist's seeded prompt stream in its
order (TRL with ``shuffle_dataset=False``); TRL's ``tools=`` reaches the template, which ignores it.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
TEMPLATE = os.path.join(HERE, "qwen2_5.jinja")  # TRL 1.16's trl/chat_templates/qwen2_5.jinja (Apache-2.0)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "special_tokens_map.json")


# Qwen2.5's system turn without the tools block (tools= ignored).
_PLAIN_SYSTEM = """{%- if messages[0]['role'] == 'system' %}
    {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}
{%- else %}
    {{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\\n' }}
{%- endif %}
"""


# SmolLM2's own ChatML (tool results as `<|im_start|>tool` turns) that also renders `tool_calls` as Qwen2.5 does:
# SmolLM2-135M opens 29 of 32 first turns with <tool_call> under it, 3 of 32 under Qwen2.5's (it writes the
# <tool_response> itself; HF generate probe, T 0.7, 8 prompts x 4).
CHATML_TOOLS = (
    "{%- for message in messages %}"
    "{%- if loop.first and messages[0]['role'] != 'system' %}{{- '<|im_start|>system\\nYou are a helpful AI "
    "assistant named SmolLM, trained by Hugging Face<|im_end|>\\n' }}{%- endif %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + (message['content'] or '') }}"
    "{%- for tool_call in message.tool_calls or [] %}"
    "{%- if tool_call.function is defined %}{%- set tool_call = tool_call.function %}{%- endif %}"
    "{%- if message['content'] or not loop.first %}{{- '\\n' }}{%- endif %}"
    "{{- '<tool_call>\\n{\"name\": \"' + tool_call.name + '\", \"arguments\": ' + (tool_call.arguments | tojson) "
    "+ '}\\n</tool_call>' }}"
    "{%- endfor %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}")


def template_text(tools_block: bool | str = True) -> str:
    """Qwen2.5's chat template (TRL's copy); ``tools_block=False``: its system turn never states the tools
    (``tools=`` is ignored), the rest (tool calls, tool responses) as Qwen2.5 renders them;
    ``"chatml"``: :data:`CHATML_TOOLS`."""
    if tools_block == "chatml":
        return CHATML_TOOLS
    with open(TEMPLATE, encoding="utf-8") as f:
        text = f.read()
    if tools_block:
        return text
    head = text.index("{%- for message in messages %}")
    return _PLAIN_SYSTEM + text[head:]


def make_tool_model(src: str, dst: str, log=print, tools_block: bool | str = True) -> str:
    """``dst``: the model of ``src`` (symlinked files) with its tokenizer's chat template replaced by
    :func:`template_text` of ``tools_block``; made once (atomically), kept while its template is that."""
    from transformers import AutoTokenizer

    want = template_text(tools_block)
    if os.path.isfile(os.path.join(dst, "config.json")):
        if AutoTokenizer.from_pretrained(dst).chat_template == want:
            return dst
        shutil.rmtree(dst)
    os.makedirs(os.path.dirname(dst) or ".", exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=os.path.basename(dst) + ".", dir=os.path.dirname(dst) or ".")
    src = os.path.abspath(src)
    for name in os.listdir(src):
        if name not in TOKENIZER_FILES and not name.startswith("."):
            os.symlink(os.path.join(src, name), os.path.join(tmp, name))
    tok = AutoTokenizer.from_pretrained(src)
    missing = [t for t in ("<|im_start|>", "<|im_end|>") if tok.convert_tokens_to_ids(t) in (None, tok.unk_token_id)]
    if missing:
        raise ValueError(f"{src}: the ChatML / Qwen2.5 templates need the tokens {missing}, not in this vocabulary")
    tok.chat_template = want
    tok.save_pretrained(tmp)
    os.replace(tmp, dst)
    log(f"[trl_compare] made {dst}: {src} with a chat template that renders tool calls ({tools_block})")
    return dst


def calculator_env(w: dict[str, Any]):
    from grpo_dist.envs.builtin import CalculatorEnv

    return CalculatorEnv(**w["env_kwargs"])


def records(w: dict[str, Any], steps: int) -> list:
    """The records of ``steps`` steps in the order of grpo_dist's seeded prompt stream."""
    from grpo_dist.data.sources import PromptStream, load_prompts

    recs = load_prompts(w["data"], split="train")
    return PromptStream(recs, seed=w["seed"]).next_batch(steps * w["prompts"])


def prompt_rows(w: dict[str, Any], steps: int) -> list[dict[str, Any]]:
    """TRL's dataset: ``prompt`` = the environment's opening messages (conversational), ``answer``."""
    env = calculator_env(w)
    return [{"prompt": env.reset(r), "answer": r.columns["answer"]} for r in records(w, steps)]


def rendered_prompts(w: dict[str, Any], model_path: str, steps: int) -> list[str]:
    """The opening of each trajectory as text, as grpo_dist renders it (``envs/chat.py``)."""
    from transformers import AutoTokenizer

    from grpo_dist.envs.chat import opening_messages, render

    tok, env = AutoTokenizer.from_pretrained(model_path), calculator_env(w)
    out = []
    for r in prompt_rows(w, steps):
        msgs, tools = opening_messages(tok, r["prompt"], env.tools, env.parser)
        out.append(render(tok, msgs, True, tools))
    return out


def calculator_answer(completions: list[list[dict[str, Any]]], answer: list[str], **kwargs: Any) -> list[float]:
    """TRL's reward: 1 if the last assistant message makes no tool call and its last number is the
    answer (what grpo_dist's calculator environment scores into ``env_reward``)."""
    from grpo_dist.envs.tools import numbers_equal

    out = []
    for msgs, want in zip(completions, answer):
        last = msgs[-1] if msgs else {}
        ok = last.get("role") == "assistant" and not last.get("tool_calls") and numbers_equal(
            str(last.get("content") or ""), want)
        out.append(1.0 if ok else 0.0)
    return out


def count_turns(trainer_cls: type, cur: dict[str, float]) -> None:
    """Wrap TRL's ``_tool_call_loop``: the assistant messages of each trajectory (turns) and the
    trajectories, added into ``cur`` (``turns_sum``, ``trajectories``)."""
    orig = trainer_cls._tool_call_loop

    def wrapper(self, *a, **k):
        out = orig(self, *a, **k)
        completions = out[1]
        cur["turns_sum"] = cur.get("turns_sum", 0.0) + sum(
            sum(1 for m in msgs if m.get("role") == "assistant") for msgs in completions)
        cur["trajectories"] = cur.get("trajectories", 0.0) + len(completions)
        return out

    trainer_cls._tool_call_loop = wrapper


def trl_tool_args(w: dict[str, Any]) -> dict[str, Any]:
    """GRPOConfig keywords of the tool loop: TRL's budget is grpo_dist's ``max_total_tokens``; its
    iterations (tool rounds after the first turn) ``max_turns - 1``."""
    return dict(max_completion_length=w["max_total_tokens"], max_tool_calling_iterations=w["max_turns"] - 1)


def grpo_tool_overrides(w: dict[str, Any]) -> list[str]:
    return ["--rollout.env", w["env"], "--rollout.env_kwargs", json.dumps(w["env_kwargs"]), "--rollout.max_turns", str(w["max_turns"]),
            "--rollout.max_total_tokens", str(w["max_total_tokens"]),
            "--rollout.max_parallel_calls", str(w["max_parallel_calls"])]

