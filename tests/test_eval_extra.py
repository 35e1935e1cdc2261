"""``eval.extra``: more held-out sets beside the main one (e.g. problems phrased another way), loaded
and checked before any actor starts, reported per set: W&B scalars ``eval/<set>/…``, one table
per set in ``grpo-dist eval``, ``eval_sets`` in summary.json. The engines' side is the slow CLI
tests (tests/test_evaluation.py, tests/test_env_eval.py)."""

from __future__ import annotations

import json

import pytest

from grpo_dist.config import ConfigError, config_from_dict
from grpo_dist.run.eval_table import eval_table
from grpo_dist.run.evaluation import eval_metrics
from grpo_dist.run.outputs import summary_lines, write_summary


def _rep(acc: float, n: int = 8, **more) -> dict:
    return {"num_prompts": n, "samples_per_prompt": 2, "temperature": 0.7, "sampled_accuracy": acc,
            "greedy_accuracy": acc / 2, "pass@1": acc, "mean_reward": acc + 0.1, "reward_means": {"math": acc},
            **more}


def test_extra_set_names_are_checked():
    cfg = config_from_dict({"eval": {"extra": {"ood": "builtin:word_problems_ood?n=16"}}})
    assert cfg.eval.extra == {"ood": "builtin:word_problems_ood?n=16"}
    assert config_from_dict({}).eval.extra == {}
    for bad in ({"reward": "x.jsonl"}, {"a/b": "x.jsonl"}, {"ood": " "}):
        with pytest.raises(ConfigError, match=r"^eval\.extra"):
            config_from_dict({"eval": {"extra": bad}})


def test_preflight_loads_and_checks_each_extra_set(tmp_path, tiny_model_dir):
    from grpo_dist.run import preflight

    base = {"model": {"path": str(tiny_model_dir), "max_model_len": 64}, "rollout": {"max_tokens": 6},
            "data": {"path": "builtin:add?n=32", "eval_size": 6}, "logging": {"wandb_mode": "disabled"},
            "output_dir": str(tmp_path / "out")}
    other = tmp_path / "other.jsonl"
    other.write_text("".join(json.dumps({"prompt": f"{i} plus 3 =", "answer": str(i + 3)}) + "\n" for i in range(9)))
    cfg = config_from_dict({**base, "eval": {"extra": {"mul": "builtin:mul?max_operand=9", "words": str(other)}}})
    extra = preflight.extra_eval_sets(cfg, log_fn=lambda m: None)
    assert list(extra) == ["mul", "words"]
    assert len(extra["mul"]) == 6 and len(extra["words"]) == 6  # at most data.eval_size each
    assert all("*" in r.prompt for r in extra["mul"])  # the builtin's eval split: disjoint from any training use
    from grpo_dist.data import make_task

    assert {r.prompt for r in extra["mul"]} <= {r.prompt for r in make_task("mul", None, split="eval", max_operand=9)}
    assert preflight.prepared_data(cfg, log_fn=lambda m: None)[1]  # the main set is unchanged beside them
    with pytest.raises(ConfigError, match=r"^eval\.extra\.gone: .*not found"):
        preflight.check(config_from_dict({**base, "eval": {"extra": {"gone": str(tmp_path / "gone.jsonl")}}}),
                        log_fn=lambda m: None)
    long = tmp_path / "long.jsonl"
    long.write_text(json.dumps({"prompt": "1+" * 60 + "1=", "answer": "61"}) + "\n")
    with pytest.raises(ConfigError, match=r"^eval\.extra\.long: "):  # overlong prompts: the same rule as the main set
        preflight.check(config_from_dict({**base, "eval": {"extra": {"long": str(long)}}}), log_fn=lambda m: None)
    with pytest.raises(ConfigError, match=r"^eval\.extra: .*data\.eval_path gives none"):
        preflight.check(config_from_dict({**base, "data": {**base["data"], "eval_path": None},
                                          "eval": {"extra": {"words": str(other)}}}), log_fn=lambda m: None)


def test_metrics_of_each_set_are_namespaced():
    report = _rep(0.5, extra={"ood": _rep(0.25, source="builtin:word_problems_ood")})
    m = eval_metrics(report)
    assert m["eval/sampled_accuracy"] == 0.5 and m["eval/reward/math"] == 0.5  # the main set's names unchanged
    assert m["eval/ood/sampled_accuracy"] == 0.25 and m["eval/ood/greedy_accuracy"] == 0.125
    assert m["eval/ood/pass@1"] == 0.25 and m["eval/ood/reward/math"] == 0.25
    assert set(eval_metrics(_rep(0.5))) == {k for k in m if not k.startswith("eval/ood/")}


def test_eval_table_has_one_table_per_set():
    report = {"report_path": "/r.json",
              "base": _rep(0.5, extra={"ood": _rep(0.25, n=4, source="builtin:word_problems_ood?n=4")}),
              "adapter_eval": _rep(0.75, extra={"ood": _rep(0.125, n=4, source="builtin:word_problems_ood?n=4")})}
    lines = eval_table(report)
    assert "(8 held-out prompts, 2 samples each, T=0.7)" in lines[0]
    i = lines.index("ood: builtin:word_problems_ood?n=4")
    assert "(4 prompts of ood, 2 samples each, T=0.7)" in lines[i + 1]
    main = [ln for ln in lines[:i] if ln.startswith("sampled_acc")]
    ood = [ln for ln in lines[i:] if ln.startswith("sampled_acc")]
    assert main[0].split()[1:] == ["0.500", "0.750", "+0.250"]
    assert ood[0].split()[1:] == ["0.250", "0.125", "-0.125"]


def test_summary_reports_each_set_before_and_after(tmp_path):
    before = _rep(0.25, extra={"ood": _rep(0.125, source="builtin:word_problems_ood")})
    after = _rep(0.75, extra={"ood": _rep(0.0625, source="builtin:word_problems_ood")})
    s = write_summary(tmp_path, 3, 10.0, tmp_path / "adapter", None, {}, [], before, after)
    assert s["sampled_accuracy_before"] == 0.25 and s["sampled_accuracy_after"] == 0.75  # unchanged
    assert s["eval_sets"] == {"ood": {"source": "builtin:word_problems_ood", "sampled_accuracy_before": 0.125,
                                      "sampled_accuracy_after": 0.0625, "greedy_accuracy_before": 0.0625,
                                      "greedy_accuracy_after": 0.03125, "mean_reward_before": 0.225,
                                      "mean_reward_after": 0.1625}}
    assert json.loads((tmp_path / "summary.json").read_text())["eval_sets"] == s["eval_sets"]
    lines = summary_lines(s)
    assert "ood/sampled_accuracy before 0.125  after 0.062  (-0.062)" in lines
    assert not any(ln.startswith("ood/") for ln in summary_lines(write_summary(tmp_path, 3, 1.0, "a", None, {}, [],
                                                                                _rep(0.1), _rep(0.2))))
