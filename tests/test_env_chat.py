"""Exact tokens across turns, on a real byte-level BPE tokenizer (trained here: tests/bpe_model.py).

* the drift: a random tiny Llama over that vocabulary samples multi-turn trajectories (rollout
  worker, transformers backend, a scripted three-turn environment); decoding them and encoding
  again -- what a loop that re-renders the history does -- gives other ids for most of them,
  while the built ids hold exactly the sampled ids (mask 1, the end-of-turn token included) and,
  between them, exactly the template's tokens for the environment's messages (mask 0);
* ``rollout.env_sanity`` reports the first differing token of a full re-render;
* the start-up check of the chat template: prefix-preserving templates pass, one that drops earlier
  reasoning blocks and one that refuses the tool role fail with a line naming the problem;
* end-of-turn handling after EOS vs after a stop string, two parallel tool calls in one turn,
  tool schemas through ``tools=`` or the system prompt, a tool result cut in the middle;
* SmolLM2-135M-Instruct's tokenizer and template, where the converted model is in the cache.
"""

from __future__ import annotations

import difflib
import json
from pathlib import Path

import pytest

from bpe_model import CHATML, make_bpe_model, make_bpe_tokenizer
from grpo_dist.config import load_config
from grpo_dist.data import make_task
from grpo_dist.envs import EnvLimits
from grpo_dist.envs.base import run
from grpo_dist.envs.builtin import CalculatorEnv
from grpo_dist.envs.chat import (MessageEncoder, TemplateError, cap_tool_messages, check_template, opening_messages,
                                 render, takes_tools)
from grpo_dist.rollout.worker import RolloutWorker
from grpo_dist.types import PromptRecord

HELPERS = Path(__file__).parent / "env_helpers.py"


@pytest.fixture(scope="module")
def bpe_tok():
    return make_bpe_tokenizer()


@pytest.fixture(scope="module")
def bpe_model_dir(tmp_path_factory):
    return make_bpe_model(tmp_path_factory.mktemp("bpe") / "model")


def test_built_ids_are_the_sampled_ones_and_a_re_render_drifts(bpe_model_dir):
    cfg = load_config(None, {"model": {"path": str(bpe_model_dir), "max_model_len": 1024}, "lora": {"enabled": False},
                             "rollout": {"backend": "hf", "group_size": 4, "max_tokens": 32, "stop": ["e"],
                                         "env": f"{HELPERS}:Chatty", "max_turns": 4, "env_sanity": True}})
    w = RolloutWorker(cfg)
    w.setup()
    tok, generate, sampled = w.engine.tokenizer, w.engine.generate, []

    def spy(prompts, spec, seeds=None):  # the real engine; its outputs recorded as they are
        out = generate(prompts, spec, seeds)
        sampled.extend((list(p), list(s.token_ids)) for p, (s,) in zip(prompts, out))
        return out

    w.engine.generate = spy
    recs = make_task("tool_problems", 8, seed=3)
    rollouts = [r for g in w.generate(recs, keys=[(0, 1, i) for i in range(8)]) for r in g.rollouts]
    w.close()
    by_context: dict[tuple, list[list[int]]] = {}  # the G trajectories of a record share their first context
    for p, s in sampled:
        by_context.setdefault(tuple(p), []).append(s)
    enc = MessageEncoder(tok)
    drifted = changed = total = 0
    for r in rollouts:
        # three turns, unless a turn used all of max_tokens (then the trajectory ends there, truncated)
        assert (r.turns, r.stop_reason, r.columns["env_reward"]) == (3, "done", 3.0) or (
            r.turns <= 3 and r.stop_reason == "length" and r.columns["truncated"])
        built, mask = r.prompt_ids + r.completion_ids, [0] * len(r.prompt_ids) + r.loss_mask
        pos, turn = len(r.prompt_ids), 0
        while pos < len(built):  # walk the turns: sampled ids as the engine gave them, then the template's tokens
            ids = next(s for s in by_context[tuple(built[:pos])] if built[pos:pos + len(s)] == s)
            assert mask[pos:pos + len(ids)] == [1] * len(ids)
            pos += len(ids)
            if turn < r.turns - 1:
                glue = enc(Chatty_replies()[turn], ids[-1])
                assert built[pos:pos + len(glue)] == glue and mask[pos:pos + len(glue)] == [0] * len(glue)
                pos += len(glue)
            turn += 1
        assert turn == r.turns and pos == len(built)
        # the text is the conversation as the template renders it (the last turn closed by it)
        msgs = [{"role": "user", "content": r.columns["question"]}]
        for k in range(r.turns):
            msgs += [{"role": "assistant", "content": _turn_text(tok, r, k)}]
            msgs += Chatty_replies()[k] if k < r.turns - 1 else []
        full = render(tok, msgs)
        assert full.startswith(tok.decode(built))
        naive = tok(tok.decode(built), add_special_tokens=False)["input_ids"]  # decode, then encode again
        drifted += naive != built
        same = sum(b.size for b in difflib.SequenceMatcher(None, built, naive, autojunk=False).get_matching_blocks())
        changed += len(built) - same
        total += len(built)
        assert (r.columns["env_sanity_diff"] >= 0) == (tok(full, add_special_tokens=False)["input_ids"][:len(built)]
                                                       != built)
    print(f"\nBPE drift: {drifted}/{len(rollouts)} trajectories re-tokenize differently after decode; "
          f"{changed}/{total} built tokens not in the re-tokenized sequence (difflib); built ids: 0 differences from the sampled ids")
    assert sum(r.stop_reason == "done" for r in rollouts) >= len(rollouts) // 2
    assert drifted >= len(rollouts) // 4  # a random policy samples non-canonical splits often
    assert any(r.columns["env_sanity_diff"] >= 0 for r in rollouts)


def Chatty_replies():
    import env_helpers

    return env_helpers.Chatty.REPLIES


def _turn_text(tok, r, k: int) -> str:
    """The decoded text of turn ``k`` (the runs of mask 1), without the end-of-turn token the model
    sampled; special tokens it sampled inside the turn (a random policy does) are kept."""
    runs, cur = [], []
    for i, m in zip(r.completion_ids, r.loss_mask):
        if m:
            cur.append(i)
        elif cur:
            runs, cur = runs + [cur], []
    runs += [cur] if cur else []
    ids = runs[k][:-1] if runs[k][-1] == tok.eos_token_id else runs[k]
    return tok.decode(ids)


REASONING_STRIPPING = (  # like templates that drop earlier turns' <think> blocks
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{% if m.role == 'assistant' and not loop.last %}"
    "{{ m.content.split('</think>')[-1].lstrip('\n') }}{% else %}{{ m.content }}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
NO_TOOL_ROLE = ("{% for m in messages %}{% if m.role not in ['system', 'user', 'assistant'] %}"
                "{{ raise_exception('Conversation roles must be system/user/assistant') }}{% endif %}"
                "<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
                "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
WITH_TOOLS = ("{% if tools %}<|im_start|>system\n# Tools\n{% for t in tools %}{{ t | tojson }}\n{% endfor %}"
              "<|im_end|>\n{% endif %}" + CHATML)


def test_template_check_names_the_problem(bpe_tok):
    check_template(bpe_tok)  # ChatML with a default system prompt: prefix-preserving
    tok = make_bpe_tokenizer()
    tok.chat_template = REASONING_STRIPPING
    with pytest.raises(TemplateError, match="not prefix-preserving: adding a 'tool' message after "
                                            r"\['system', 'user', 'assistant'\] re-renders the earlier messages"):
        check_template(tok)
    tok.chat_template = NO_TOOL_ROLE
    with pytest.raises(TemplateError, match="cannot render a 'tool' message .*roles must be system/user/assistant"):
        check_template(tok)
    check_template(tok, roles=("user",))  # fine for an environment that answers as the user
    with pytest.raises(TemplateError):
        MessageEncoder(tok)  # the rollout worker's encoder checks at its start too


def test_end_of_turn_after_eos_vs_after_a_stop_string(bpe_tok):
    enc = MessageEncoder(bpe_tok)
    msgs = [{"role": "user", "content": "Higher."}]
    after_eos = enc(msgs, bpe_tok.eos_token_id)  # the model sampled <|im_end|>: mask 1, not repeated
    assert bpe_tok.decode(after_eos) == "\n<|im_start|>user\nHigher.<|im_end|>\n<|im_start|>assistant\n"
    stop_tok = bpe_tok("</tool_call>", add_special_tokens=False)["input_ids"][-1]
    after_stop = enc(msgs, stop_tok)  # the turn ended on a stop string: the template's end of turn is glue
    assert after_stop == [bpe_tok.eos_token_id] + after_eos


def test_two_parallel_tool_calls_in_one_turn_at_exact_positions(bpe_tok):
    env = CalculatorEnv(system_prompt=None, limits=EnvLimits(max_parallel_calls=2))
    assert env.stop == []  # several calls per turn: the model ends the turn with its end-of-turn token
    env.reset(PromptRecord(0, "q", {"answer": "90"}))
    text = ('<tool_call>\n{"name": "calculator", "arguments": {"expression": "12*7"}}\n</tool_call>\n'
            '<tool_call>\n{"name": "calculator", "arguments": {"expression": "2*3"}}\n</tool_call>')
    sampled = bpe_tok(text, add_special_tokens=False)["input_ids"] + [bpe_tok.eos_token_id]
    step = run(env.step(bpe_tok.decode(sampled, skip_special_tokens=True)))
    assert [m["content"] for m in step.messages] == ["84", "6"] and step.info["tool_calls"] == 2
    glue = MessageEncoder(bpe_tok)(step.messages, sampled[-1])
    assert bpe_tok.decode(glue) == ("\n<|im_start|>tool\n84<|im_end|>\n<|im_start|>tool\n6<|im_end|>\n"
                                    "<|im_start|>assistant\n")
    final = bpe_tok("90", add_special_tokens=False)["input_ids"] + [bpe_tok.eos_token_id]
    ids = sampled + glue + final
    mask = [1] * len(sampled) + [0] * len(glue) + [1] * len(final)
    eos_at = [i for i, t in enumerate(ids) if t == bpe_tok.eos_token_id]
    # both end-of-turn tokens the model produced are trained on; the tools' <|im_end|>s are not
    assert [mask[i] for i in eos_at] == [1, 0, 0, 1] and eos_at[0] == len(sampled) - 1 and eos_at[-1] == len(ids) - 1


def test_tool_schemas_through_tools_or_the_system_prompt(bpe_tok):
    env = CalculatorEnv(system_prompt="Solve it.", limits=EnvLimits())
    opening = env.reset(PromptRecord(0, "q", {"question": "What is 2+2?"}))
    assert not takes_tools(bpe_tok, env.tools)  # plain ChatML: stated in the system prompt, Hermes format
    msgs, tools = opening_messages(bpe_tok, opening, env.tools, env.parser)
    assert tools is None and msgs[0]["content"].startswith("Solve it.\n\n# Tools")
    assert json.dumps(env.tools[0]) in msgs[0]["content"] and "<tool_call>" in msgs[0]["content"]
    tok = make_bpe_tokenizer()
    tok.chat_template = WITH_TOOLS
    assert takes_tools(tok, env.tools)
    msgs, tools = opening_messages(tok, opening, env.tools, env.parser)
    assert tools == env.tools and msgs == opening  # the template renders them itself


def test_few_shot_calculator_opening_states_its_tool_itself(bpe_tok):
    """few_shot: the short call format in the system prompt, one worked conversation (its tool
    result is what the calculator returns), the hint after the question; no schema block."""
    env = CalculatorEnv(few_shot=True, limits=EnvLimits())
    opening = env.reset(PromptRecord(0, "q", {"question": "What is 2+2?"}))
    assert [m["role"] for m in opening] == ["system", "user", "assistant", "tool", "assistant", "user"]
    assert opening[-1]["content"] == "What is 2+2? Use the calculator."
    example = env.parser.parse(opening[2]["content"])
    assert len(example.calls) == 1 and not example.errors
    assert run(env.run_call(example.calls[0])).content == opening[3]["content"] == "436"
    msgs, tools = opening_messages(bpe_tok, opening, env.tools, env.parser)
    assert env.tools == [] and tools is None and msgs == opening and "# Tools" not in msgs[0]["content"]
    assert env.stop == ["</tool_call>"]  # generation still stops after a call


def test_a_long_tool_result_is_cut_in_the_middle(bpe_tok):
    long = " ".join(str(i) for i in range(300))
    msgs, cut = cap_tool_messages(bpe_tok, [{"role": "tool", "content": long}, {"role": "user", "content": long}], 20)
    assert cut == 1 and msgs[1]["content"] == long  # only tool results are capped
    head, _, tail = msgs[0]["content"].partition("\n...[")
    n = len(bpe_tok(long, add_special_tokens=False)["input_ids"])
    assert long.startswith(head) and tail.startswith(f"{n - 20} tokens cut]...\n") and long.endswith(tail.split("\n")[-1])


@pytest.mark.slow  # the first use converts the model (~40 s; tests/test_real_model.py shares it)
def test_smollm2_template_and_tokenizer(smollm2_dir):
    import random

    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(smollm2_dir)
    check_template(tok)  # plain ChatML: prefix-preserving, any role
    assert not takes_tools(tok, CalculatorEnv(limits=EnvLimits()).tools)  # no tools= support: system prompt
    enc = MessageEncoder(tok)
    assert tok.decode(enc([{"role": "tool", "content": "84"}], tok.eos_token_id)) == (
        "\n<|im_start|>tool\n84<|im_end|>\n<|im_start|>assistant\n")
    rng, special = random.Random(0), set(tok.all_special_ids)
    seqs = [[i for i in (rng.randrange(len(tok)) for _ in range(32)) if i not in special] for _ in range(200)]
    drift = sum(tok(tok.decode(s), add_special_tokens=False)["input_ids"] != s for s in seqs)
    print(f"\nSmolLM2 tokenizer: {drift}/200 random 32-token sequences re-tokenize differently after decode")
    assert drift > 100


def test_preflight_stops_on_a_template_that_rewrites_earlier_turns(bpe_model_dir, tmp_path):
    import shutil

    from grpo_dist.config import ConfigError
    from grpo_dist.run import preflight

    bad = tmp_path / "bad"
    shutil.copytree(bpe_model_dir, bad)
    tok = make_bpe_tokenizer()
    tok.chat_template = REASONING_STRIPPING
    tok.save_pretrained(bad)
    over = {"model": {"path": str(bad), "max_model_len": 1024}, "lora": {"enabled": False},
            "data": {"path": "builtin:tool_problems?n=8", "eval_path": None},
            "rollout": {"env": "calculator", "max_tokens": 16},
            "reward": {"functions": [{"fn": "grpo_dist.envs.rewards:env_reward"}]}}
    with pytest.raises(ConfigError, match=r"^rollout\.env: model\.path's tokenizer: the chat template is not "
                                          r"prefix-preserving"):
        preflight.check(load_config(None, over), log_fn=lambda *_: None)
    over["model"]["path"] = str(bpe_model_dir)
    preflight.check(load_config(None, over), log_fn=lambda *_: None)  # the same config, a ChatML template: fine
    over["data"]["path"] = str(_jsonl(tmp_path, [{"prompt": "p", "env": "chess"}]))
    over["rollout"]["env_column"] = "env"
    with pytest.raises(ConfigError, match="rollout.env: column 'env' value 'chess': unknown environment 'chess'"):
        preflight.check(load_config(None, over), log_fn=lambda *_: None)


def _jsonl(tmp_path, rows):
    p = tmp_path / "rows.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return p


QWEN3 = (Path(__file__).parent / "data" / "qwen3_chat_template.jinja").read_text()  # Qwen3's own chat template


def test_qwen3_with_thinking_trains_multi_turn_through_its_training_template():
    """Qwen3's template rewrites history (it drops the reasoning of turns before the last user
    query, and adds an empty reasoning block to the last turn only): the start-up check passes with
    its training template, whose opening is the model's own; a thinking conversation built token
    in, token out (calculator calls, a follow-up question) is exactly its rendering, while Qwen3's
    own rendering of the same conversation has lost the earlier turns' reasoning."""
    from grpo_dist.envs.chat import _problem, encode_opening, template_for

    tok = make_bpe_tokenizer()
    tok.chat_template = QWEN3
    assert "not prefix-preserving" in _problem(tok, None)
    shipped = Path(__file__).parents[1] / "grpo_dist" / "envs" / "templates" / "qwen3_training.jinja"
    assert template_for(tok) == shipped.read_text()
    check_template(tok)
    MessageEncoder(tok)  # the rollout worker's encoder accepts it too
    env = CalculatorEnv(system_prompt="Use the calculator.")
    opening = env.reset(PromptRecord(0, "What is 12*7+5?", {"answer": "89"}))
    ids = encode_opening(tok, opening, env.tools, env.parser)
    own, _ = opening_messages(tok, opening, env.tools, env.parser)
    assert tok.decode(ids) == render(tok, own, True, env.tools, template=None)  # turn one as served
    call = '<tool_call>\n{{"name": "calculator", "arguments": {{"expression": "{}"}}}}\n</tool_call>'
    turns = [(f"<think>\nFirst 12*7.\n</think>\n\n{call.format('12*7')}", [{"role": "tool", "content": "84"}]),
             (f"<think>\nThen add 5.\n</think>\n\n{call.format('84+5')}", [{"role": "tool", "content": "89"}]),
             ("<think>\nDone.\n</think>\n\nThe answer is 89.", [{"role": "user", "content": "And doubled?"}]),
             ("<think>\n89*2 is 178.\n</think>\n\n178", [])]
    enc, built, msgs = MessageEncoder(tok), list(ids), list(own)
    for text, reply in turns:
        sampled = tok(text, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
        built += sampled + enc(reply, sampled[-1])
        msgs += [{"role": "assistant", "content": text}] + reply
    full = render(tok, msgs, tools=env.tools)
    assert full.startswith(tok.decode(built)) and full[len(tok.decode(built)):] == "\n"
    assert tok(full, add_special_tokens=False)["input_ids"][:len(built)] == built
    served = render(tok, msgs, tools=env.tools, template=None)
    assert "First 12*7." in full and "First 12*7." not in served and "89*2 is 178." in served
    # a template of a family without a training template is refused, saying what to do
    tok.chat_template = REASONING_STRIPPING
    with pytest.raises(TemplateError, match="training templates for qwen3 .*tokenizer_config.json$"):
        check_template(tok)
