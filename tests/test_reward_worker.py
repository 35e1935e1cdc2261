"""Reward registry (builtins, module and file plug-ins, errors) and the robust RewardWorker."""

from __future__ import annotations

import logging
import math
import sys
import textwrap
import threading
import time

import pytest

from grpo_dist.config import RewardConfig, RewardFnConfig
from grpo_dist.reward import RewardWorker, build_reward_fns, get_reward_fn, register_reward
from grpo_dist.reward import registry as reg

FAIL = -1.0


@pytest.fixture
def isolated_registry(monkeypatch):
    """Registrations made by a test vanish afterwards."""
    monkeypatch.setattr(reg, "_REGISTRY", dict(reg._REGISTRY))


def _write(path, body: str):
    path.write_text(textwrap.dedent(body))
    return path


def _worker(*entries, timeout_s=5.0) -> RewardWorker:
    fns = [RewardFnConfig(**e) if isinstance(e, dict) else RewardFnConfig(fn=e) for e in entries]
    return RewardWorker(RewardConfig(functions=fns, timeout_s=timeout_s, failure_reward=FAIL))


# ----------------------------------------------------------------------------- registry

def test_module_plugin_with_trl_signature_reads_column(tmp_path, monkeypatch):
    _write(tmp_path / "rw_mod_plugin.py", """
        def starts_with_hint(prompts, completions, **kwargs):
            return [1.0 if c.startswith(h) else 0.0 for c, h in zip(completions, kwargs["hint"])]

        def scaled(prompts, completions, scale=1.0):
            return [scale * len(c) for c in completions]

        NOT_CALLABLE = 3
        """)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "rw_mod_plugin", raising=False)
    fn = get_reward_fn("rw_mod_plugin:starts_with_hint")
    assert fn(["p", "p"], ["abc", "xbc"], hint=["a", "a"], other=[1, 2]) == [1.0, 0.0]
    (named,) = build_reward_fns([RewardFnConfig(fn="rw_mod_plugin:scaled", weight=2, kwargs={"scale": 0.5})])
    assert (named.name, named.weight) == ("scaled", 2.0)
    assert named(["p"], ["abcd"]) == [2.0]
    with pytest.raises(ValueError, match=r"'rw_mod_plugin:nope'.*no attribute 'nope'.*scaled"):
        get_reward_fn("rw_mod_plugin:nope")
    with pytest.raises(ValueError, match="not callable"):
        get_reward_fn("rw_mod_plugin:NOT_CALLABLE")
    with pytest.raises(ValueError, match=r"unknown option\(s\) scal\b.*accepted: scale"):
        build_reward_fns([RewardFnConfig(fn="rw_mod_plugin:scaled", kwargs={"scal": 2})])


def test_file_plugin_absolute_and_relative(tmp_path, monkeypatch):
    path = _write(tmp_path / "my rewards.py", """
        from dataclasses import dataclass

        @dataclass
        class Box:  # needs the module in sys.modules while it loads
            v: float

        def has_answer_tag(prompts, completions, **kwargs):
            return [Box(float("<answer>" in c)).v for c in completions]
        """)
    fn = get_reward_fn(f"{path}:has_answer_tag")
    assert fn(None, ["<answer>1</answer>", "1"]) == [1.0, 0.0]
    monkeypatch.chdir(tmp_path)
    assert get_reward_fn("./my rewards.py:has_answer_tag") is fn  # loaded once per file
    (named,) = build_reward_fns([{"fn": f"{path}:has_answer_tag"}])
    assert named.name == "has_answer_tag"


def test_bad_specs_have_clear_errors(tmp_path, monkeypatch):
    with pytest.raises(ValueError, match=r"unknown reward function 'corectness'.*correctness.*format"):
        get_reward_fn("corectness")
    with pytest.raises(ValueError, match=r"'no_such_module_xyz:f'.*module 'no_such_module_xyz' not found"):
        get_reward_fn("no_such_module_xyz:f")
    with pytest.raises(ValueError, match=r"file '.*missing\.py' not found"):
        get_reward_fn(str(tmp_path / "missing.py") + ":f")
    with pytest.raises(ValueError, match="expected 'module.path:function'"):
        get_reward_fn("somemodule:")
    with pytest.raises(ValueError, match="non-empty"):
        get_reward_fn("  ")
    broken = _write(tmp_path / "broken.py", "def f(:\n")
    with pytest.raises(ValueError, match=r"broken\.py.*SyntaxError"):
        get_reward_fn(f"{broken}:f")
    _write(tmp_path / "rw_bad_dep.py", "import no_such_dependency_xyz\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ValueError, match=r"importing module 'rw_bad_dep' failed.*no_such_dependency_xyz"):
        get_reward_fn("rw_bad_dep:f")


def test_build_checks_names_and_options():
    with pytest.raises(ValueError, match="duplicate reward name 'format'"):
        build_reward_fns([RewardFnConfig(fn="format"), RewardFnConfig(fn="format", kwargs={"strict": False})])
    two = build_reward_fns([RewardFnConfig(fn="format"), RewardFnConfig(fn="format", name="loose",
                                                                        kwargs={"strict": False})])
    assert [f.name for f in two] == ["format", "loose"]
    with pytest.raises(ValueError, match=r"'length'.*unknown option\(s\) max_length"):
        build_reward_fns([RewardFnConfig(fn="length", kwargs={"max_length": 5})])
    with pytest.raises(ValueError, match=r"'correctness'.*mode must be"):
        build_reward_fns([RewardFnConfig(fn="correctness", kwargs={"mode": "fuzzy"})])
    with pytest.raises(ValueError, match=r"'pattern'.*bad regex"):
        build_reward_fns([RewardFnConfig(fn="pattern", kwargs={"regex": "("})])
    with pytest.raises(ValueError, match=r"'composite'.*unknown reward function 'nope'"):
        build_reward_fns([RewardFnConfig(fn="composite", kwargs={"components": [{"fn": "nope"}]})])
    with pytest.raises(ValueError, match="cannot be set"):
        build_reward_fns([RewardFnConfig(fn="format", kwargs={"completions": []})])


def test_register_reward_plugin_by_name(isolated_registry):
    @register_reward("rw_shout")
    def shout(prompts, completions, bonus=0.0, **kwargs):
        return [float(c.isupper()) + bonus for c in completions]

    assert get_reward_fn("rw_shout") is shout
    with pytest.raises(ValueError, match="already registered"):
        register_reward("rw_shout")(lambda p, c: [])
    # A dataset column named like the option does not override it (or the default).
    (named,) = build_reward_fns([RewardFnConfig(fn="rw_shout")])
    assert named(["p", "p"], ["HI", "hi"], bonus=[5, 5]) == [1.0, 0.0]


def test_builtin_name_resolution_in_build():
    names = [f.name for f in build_reward_fns(RewardConfig().functions)]
    assert names == ["correctness"]


# ----------------------------------------------------------------------------- worker

@pytest.fixture
def misbehaving(isolated_registry):
    """Registers reward functions that fail in different ways; yields the event releasing `slow`."""
    release = threading.Event()

    @register_reward("rw_const")
    def const(prompts, completions, value=1.0, **kwargs):
        return [value] * len(completions)

    @register_reward("rw_raise")
    def boom(prompts, completions, **kwargs):
        raise RuntimeError("kaboom")

    @register_reward("rw_slow")
    def slow(prompts, completions, **kwargs):
        release.wait(2.0)
        return [1.0] * len(completions)

    @register_reward("rw_short")
    def short(prompts, completions, **kwargs):
        return [1.0] * (len(completions) - 1)

    @register_reward("rw_nan")
    def nan(prompts, completions, **kwargs):
        return [math.nan, 0.5, "0.7", None][: len(completions)]

    yield release
    release.set()


def test_worker_per_function_and_weighted_total():
    w = _worker({"fn": "correctness", "weight": 2.0}, {"fn": "format", "weight": 0.5},
                {"fn": "length", "weight": -0.1, "kwargs": {"max_len": 10}})
    comps = ["<think>t</think><answer>4</answer>", "4", "<answer>5</answer>"]
    res = w.score(["p"] * 3, comps, {"answer": ["4", "4", "4"], "task": ["add"] * 3})
    assert w.names() == ["correctness", "format", "length"]
    assert res.per_function["correctness"] == [1.0, 1.0, 0.0]
    assert res.per_function["format"] == [1.0, 0.0, 0.4]
    assert res.per_function["length"] == [0.0, 1.0, 0.2]  # lengths 34, 1, 18
    assert res.total == pytest.approx([2.5, 1.9, 0.18])
    assert res.errors == {"correctness": 0, "format": 0, "length": 0}


def test_worker_conversational_completions():
    w = _worker("correctness")
    conv = [[{"role": "assistant", "content": "<answer>9</answer>"}], [{"role": "assistant", "content": "8"}]]
    assert w.score(["p", "p"], conv, {"answer": [9, 9]}).total == [1.0, 0.0]


def test_worker_exception_gives_failure_and_logs_traceback_once(misbehaving, caplog):
    w = _worker({"fn": "rw_const", "kwargs": {"value": 0.25}}, {"fn": "rw_raise", "weight": 2.0})
    with caplog.at_level(logging.WARNING, logger="grpo_dist.reward"):
        res = w.score(["p"] * 3, ["a", "b", "c"], {})
        res2 = w.score(["p"] * 2, ["a", "b"], {})
    assert res.per_function == {"rw_const": [0.25] * 3, "rw_raise": [FAIL] * 3}
    assert res.total == [0.25 + 2 * FAIL] * 3
    assert res.errors == {"rw_const": 0, "rw_raise": 3}
    assert res2.errors["rw_raise"] == 2
    recs = [r for r in caplog.records if r.name == "grpo_dist.reward"]
    assert len(recs) == 2
    assert all("'rw_raise'" in r.getMessage() and "kaboom" in r.getMessage() for r in recs)
    assert recs[0].exc_info is not None and recs[1].exc_info is None


def test_worker_timeout_is_abandoned_then_recovers(misbehaving, caplog):
    release = misbehaving
    w = _worker("rw_const", "rw_slow", timeout_s=0.2)
    t0 = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="grpo_dist.reward"):
        res = w.score(["p"] * 2, ["a", "b"], {})
        again = w.score(["p"] * 2, ["a", "b"], {})  # old call still running: not started again
    assert time.monotonic() - t0 < 1.0
    assert res.per_function == {"rw_const": [1.0, 1.0], "rw_slow": [FAIL, FAIL]}
    assert res.errors == {"rw_const": 0, "rw_slow": 2}
    assert again.errors["rw_slow"] == 2
    msgs = [r.getMessage() for r in caplog.records if r.name == "grpo_dist.reward"]
    assert "timed out" in msgs[0] and "release.wait" in msgs[0]  # the stuck stack, first time
    assert "still running" in msgs[1]
    release.set()
    w.caller._abandoned["rw_slow"].join(2.0)
    healed = w.score(["p"], ["a"], {})
    assert healed.per_function["rw_slow"] == [1.0] and healed.errors["rw_slow"] == 0


def test_worker_wrong_length_and_nan_elements(misbehaving, caplog):
    w = _worker("rw_const", "rw_short", "rw_nan")
    with caplog.at_level(logging.WARNING, logger="grpo_dist.reward"):
        res = w.score(["p"] * 4, ["a", "b", "c", "d"], {})
    assert res.per_function["rw_const"] == [1.0] * 4
    assert res.per_function["rw_short"] == [FAIL] * 4
    # NaN and the string are failures element-wise; None is TRL's "not applicable": no error, not summed.
    assert res.per_function["rw_nan"] == [FAIL, 0.5, FAIL, None]
    assert res.errors == {"rw_const": 0, "rw_short": 4, "rw_nan": 2}
    assert res.reasons == {"rw_short": "returned 3 values for 4 completions",
                           "rw_nan": "returned nan, non-numeric str for 2 of 4 completions"}
    assert res.total == [1.0 + FAIL + FAIL, 1.0 + FAIL + 0.5, 1.0 + FAIL + FAIL, 1.0 + FAIL]
    msgs = " | ".join(r.getMessage() for r in caplog.records)
    assert "'rw_short'" in msgs and "3 values for 4" in msgs
    assert "'rw_nan'" in msgs and "2 of 4" in msgs and "nan" in msgs


def test_worker_accepts_array_results_and_scalars(isolated_registry):
    np = pytest.importorskip("numpy")  # torch tensors take the same .tolist() path
    register_reward("rw_np")(lambda p, c, **k: np.array([0.5] * len(c), dtype=np.float32))
    register_reward("rw_scalars")(lambda p, c, **k: [np.float64(0.25), True][: len(c)])
    res = _worker("rw_np", "rw_scalars").score(["p", "p"], ["a", "b"], {})
    assert res.total == [0.75, 1.5] and res.errors == {"rw_np": 0, "rw_scalars": 0}


def test_worker_config_errors_are_failures_not_crashes(caplog):
    w = _worker("correctness")  # no answer column in this batch
    with caplog.at_level(logging.WARNING, logger="grpo_dist.reward"):
        res = w.score(["p"], ["4"], {})
    assert res.total == [FAIL] and res.errors == {"correctness": 1}
    assert "needs an 'answer'" in caplog.text


def test_worker_fails_fast_on_bad_plugin_and_bad_calls():
    with pytest.raises(ValueError, match="no_such_module_xyz"):
        _worker("no_such_module_xyz:f")
    w = _worker("format")
    with pytest.raises(ValueError, match="2 prompts for 1"):
        w.score(["p", "p"], ["x"], {})
    with pytest.raises(ValueError, match="column 'answer'"):
        w.score(["p"], ["x"], {"answer": ["1", "2"]})
    empty = w.score([], [], {})
    assert empty.total == [] and empty.per_function == {"format": []} and empty.errors == {"format": 0}


def test_worker_functions_cannot_mutate_callers_lists(isolated_registry):
    @register_reward("rw_mutate")
    def mutate(prompts, completions, **kwargs):
        completions.clear()
        kwargs["answer"].append("x")
        return []

    comps, answers = ["4", "5"], ["4", "4"]
    res = _worker("rw_mutate", "correctness").score(["p", "p"], comps, {"answer": answers})
    assert comps == ["4", "5"] and answers == ["4", "4"]
    assert res.per_function["correctness"] == [1.0, 0.0] and res.errors["rw_mutate"] == 2
