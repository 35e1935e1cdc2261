"""FailureWatch: a reward function broken from the first step stops the run at once, one failing
too often over reward.failure_window steps stops it, and a finished run in which one failed on more
than reward.max_failure_rate of its completions does not succeed. Through the CLI:
tests/test_failures_after_start.py."""

from __future__ import annotations

import json

import pytest

from grpo_dist.config import load_config
from grpo_dist.reward.failures import FailureWatch, RewardFailureError
from grpo_dist.reward.worker import RewardWorker
from grpo_dist.types import RewardResult

FAIL = 0.0


def _watch(rate=0.5, window=3):
    return FailureWatch(load_config(None, {"reward": {"max_failure_rate": rate, "failure_window": window}}).reward)


def _scores(values: dict[str, list], errors: dict[str, int] | None = None, tracebacks=None, reasons=None):
    n = len(next(iter(values.values())))
    return RewardResult(total=[0.0] * n, per_function=values, errors=errors or {k: 0 for k in values},
                        tracebacks=tracebacks or {}, reasons=reasons or {})


def test_rate_is_measured_over_the_window_of_steps():
    w = _watch(rate=0.5, window=3)
    w.observe(_scores({"ok": [1.0] * 8, "flaky": [0.0] * 8}, {"ok": 0, "flaky": 4}, {"flaky": "Traceback ... KeyError: 'x'"},
                      {"flaky": "KeyError: 'x'"}))
    assert w.end_step() == {"reward/failure_rate/ok": 0.0, "reward/failure_rate/flaky": 0.5,
                            "reward/none_frac/ok": 0.0, "reward/none_frac/flaky": 0.0}  # window not full yet
    w.observe(_scores({"ok": [1.0] * 4, "flaky": [0.0] * 4}))
    w.observe(_scores({"ok": [1.0] * 4, "flaky": [0.0] * 4}, {"ok": 0, "flaky": 1}, {"flaky": "a later traceback"}))
    assert w.end_step()["reward/failure_rate/flaky"] == pytest.approx(5 / 16)  # two scoring rounds in one step
    w.observe(_scores({"ok": [1.0] * 8, "flaky": [0.0] * 8}, {"ok": 1, "flaky": 0}))
    rates = w.end_step()  # full window: 5 of 24 under the limit
    assert rates["reward/failure_rate/ok"] == pytest.approx(1 / 24)
    assert rates["reward/failure_rate/flaky"] == pytest.approx(5 / 24)
    w.observe(_scores({"flaky": [0.0] * 8}, {"flaky": 3}))  # the first step leaves the window: (0 + 1 + 3) / 24
    assert w.end_step()["reward/failure_rate/flaky"] == pytest.approx(4 / 24)
    assert w.first["flaky"] == ("KeyError: 'x'", "Traceback ... KeyError: 'x'")


def test_stops_only_past_the_limit_once_the_window_is_full():
    w = _watch(rate=0.5, window=2)
    for k in (3, 4):  # 7 of 16 = 0.4375: under the limit
        w.observe(_scores({"f": [0.0] * 8}, {"f": k}, {"f": "Traceback (most recent call last):\nZeroDivisionError: "
                                                          "division by zero"}, {"f": "ZeroDivisionError: division by zero"}))
        w.end_step()
    w.observe(_scores({"f": [0.0] * 8}, {"f": 8}))  # window = the last 2 steps: 12 of 16 = 0.75
    with pytest.raises(RewardFailureError) as e:
        w.end_step()
    err = e.value
    assert (err.fn, err.scored, err.window) == ("f", 16, 2) and err.rate == pytest.approx(0.75)
    assert "reward function 'f' failed on 75% of its 16 completions over the last 2 steps" in str(err)
    assert err.details().startswith("first failure of 'f': ZeroDivisionError: division by zero\nTraceback")
    never = _watch(rate=1.0, window=1)
    never.observe(_scores({"f": [0.0] * 8}, {"f": 8}))
    assert never.end_step()["reward/failure_rate/f"] == 1.0


@pytest.mark.parametrize("values, errors, reason, why", [
    ([FAIL] * 8, 8, "returned 7 values for 8 completions", "returned 7 values for 8 completions"),
    ([FAIL] * 8, 8, "returned non-numeric str for 8 of 8 completions",
     "returned non-numeric str for 8 of 8 completions"),
    ([None] * 8, 0, None, "returned None (not applicable) for all 8 completions"),
    ([FAIL] * 8, 8, "RuntimeError: reward server down", "RuntimeError: reward server down"),
])
def test_a_function_failing_on_the_whole_first_step_stops_at_once(values, errors, reason, why):
    w = _watch(rate=0.5, window=5)
    w.observe(_scores({"ok": [1.0] * 8, "bad": values}, {"ok": 0, "bad": errors}, {},
                      {"bad": reason} if reason else {}))
    with pytest.raises(RewardFailureError) as e:
        w.end_step()
    assert e.value.first_step and e.value.fn == "bad"
    assert str(e.value) == f"reward function 'bad' failed on all 8 completions of the first step: {why}"
    assert "\n" not in str(e.value)


def test_later_whole_batch_failures_and_partial_nones_do_not_stop_at_once():
    w = _watch(rate=0.5, window=5)
    w.observe(_scores({"f": [1.0] * 4, "some": [None, 1.0, None, None]}))
    m = w.end_step()
    assert m["reward/none_frac/some"] == 0.75 and m["reward/failure_rate/some"] == 0.0
    w.observe(_scores({"f": [FAIL] * 4, "some": [None] * 4}, {"f": 4, "some": 0}, {}, {"f": "ValueError: x"}))
    m = w.end_step()  # a whole failing step after a good one: the window decides
    assert m["reward/failure_rate/f"] == 0.5 and m["reward/failure_rate/some"] == 0.5  # all None = failed
    assert w.first["some"][0] == "returned None (not applicable) for all 4 completions"
    allowed = _watch(rate=1.0, window=5)  # max_failure_rate 1: never stop
    allowed.observe(_scores({"f": [None] * 4}))
    allowed.end_step()


def test_the_whole_run_is_checked_at_the_end_and_reported():
    w = _watch(rate=0.3, window=5)
    for k in (2, 1):  # 3 of 8 = 37.5% over a run shorter than the window
        w.observe(_scores({"ok": [1.0] * 4, "nan": [0.5] * 4}, {"ok": 0, "nan": k}, {}, {"nan": "returned nan for 2 of 4 completions"}))
        w.end_step()
    assert w.report() == {"ok": {"scored": 8, "failed": 0, "rate": 0.0, "none": 0},
                          "nan": {"scored": 8, "failed": 3, "rate": 0.375, "none": 0,
                                  "first_failure": "returned nan for 2 of 4 completions"}}
    with pytest.raises(RewardFailureError) as e:
        w.check_run()
    assert str(e.value) == ("reward function 'nan' failed on 3 of its 8 completions (38%) over the whole run "
                            "(reward.max_failure_rate 0.3)")
    again = _watch(rate=0.3, window=5)
    again.load_state_dict(json.loads(json.dumps(w.state_dict())))  # a resumed run keeps the whole run's counts
    assert again.report() == w.report()
    fine = _watch(rate=0.5, window=5)
    fine.observe(_scores({"ok": [1.0] * 4}))
    fine.end_step()
    fine.check_run()


def test_worker_sends_each_functions_first_traceback_once(tmp_path):
    plugin = tmp_path / "bad.py"
    plugin.write_text("def boom(prompts, completions, **kw):\n    return [1 / 0 for _ in completions]\n")
    w = RewardWorker(load_config(None, {"reward": {"functions": [{"fn": f"{plugin}:boom"}, {"fn": "format"}]}}).reward)
    first = w.score(["p"] * 2, ["a", "b"])
    assert first.errors == {"boom": 2, "format": 0} and list(first.tracebacks) == ["boom"]
    assert "ZeroDivisionError: division by zero" in first.tracebacks["boom"] and "bad.py" in first.tracebacks["boom"]
    assert first.reasons == {"boom": "ZeroDivisionError: division by zero"}
    second = w.score(["p"] * 2, ["a", "b"])
    assert second.errors["boom"] == 2 and second.tracebacks == {}
    assert second.reasons == {"boom": "ZeroDivisionError: division by zero"}  # the reason comes with every call
