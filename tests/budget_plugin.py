"""Each test's time budget (issue 45): the suite prints its ten slowest tests beside their budgets, and
fails when a test runs past its budget, so that a new feature cannot quietly double CI.

A test's time is its setup, call and teardown together (a module fixture, e.g. a training run several
tests read, is charged to the test that builds it), less the session fixtures it set up (the models
built once per worker into the cache: a clean clone pays them once, whichever test asks first). Its
budget is ``@pytest.mark.budget(seconds)`` where set, else ``DEFAULT_SLOW_S`` for a test marked ``slow``
(it starts the real stack) and ``DEFAULT_FAST_S`` for the rest. Budgets leave about 2x headroom over the
times measured on the 2-core CI machine
(docs/development.md has the table); ``GRPO_DIST_TEST_BUDGET_SCALE`` multiplies every budget (a slower
machine), ``0`` turns the check off (the table is still printed); ``GRPO_DIST_TEST_TIMES=FILE`` writes
every test's time as JSON (``{nodeid: seconds}``) for a per-file account. Works with pytest-xdist: each worker
attaches the budget to the test's report, the controller adds up and judges.
"""

from __future__ import annotations

import json
import os
import time
from collections import defaultdict

import pytest

DEFAULT_FAST_S = 60.0
DEFAULT_SLOW_S = 240.0  # the slowest unmarked test took 124 s (2026-11-29)
SHOW = 10
_KEY = "budget_s"
_EXCLUDED = "budget_excluded_s"  # session fixtures set up in this phase


def budget_of(item) -> float:
    mark = item.get_closest_marker("budget")
    if mark is not None:
        return float(mark.args[0])
    return DEFAULT_SLOW_S if item.get_closest_marker("slow") is not None else DEFAULT_FAST_S


def pytest_configure(config):
    config.addinivalue_line("markers", "budget(seconds): this test's time budget (setup + call + teardown), "
                                       "checked at the end of the session (tests/budget_plugin.py)")
    config.pluginmanager.register(Budgets(config), "grpo_dist_budgets")


def _scale() -> float:
    try:
        return float(os.environ.get("GRPO_DIST_TEST_BUDGET_SCALE", "1"))
    except ValueError:
        return 1.0


class Budgets:
    """Each test's time and budget, added up from its reports (on the controller under xdist)."""

    def __init__(self, config):
        self.config = config
        self.worker = hasattr(config, "workerinput")  # an xdist worker: it only attaches budgets
        self.times: dict[str, float] = defaultdict(float)
        self.limits: dict[str, float] = {}
        self.session_s: dict[str, float] = defaultdict(float)  # on the worker: session fixtures per test

    @pytest.hookimpl(hookwrapper=True)
    def pytest_fixture_setup(self, fixturedef, request):
        t0 = time.perf_counter()
        yield
        item = getattr(request, "_pyfuncitem", None)  # the test whose set-up asked for it
        if fixturedef.scope == "session" and item is not None:
            self.session_s[item.nodeid] += time.perf_counter() - t0

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(self, item, call):
        outcome = yield
        props = outcome.get_result().user_properties
        if call.when == "setup":
            props.append((_EXCLUDED, self.session_s.pop(item.nodeid, 0.0)))
        props.append((_KEY, budget_of(item)))

    def pytest_runtest_logreport(self, report):
        self.times[report.nodeid] += report.duration
        for k, v in report.user_properties:
            if k == _KEY:
                self.limits[report.nodeid] = float(v)
            elif k == _EXCLUDED and report.when == "setup":
                self.times[report.nodeid] -= float(v)

    def over_budget(self) -> list[tuple[str, float, float]]:
        scale = _scale()
        if scale <= 0:
            return []
        return sorted(((n, t, self.limits[n] * scale) for n, t in self.times.items()
                       if n in self.limits and t > self.limits[n] * scale), key=lambda x: -x[1])

    def pytest_terminal_summary(self, terminalreporter):
        if self.worker or not self.times:
            return
        tr, scale = terminalreporter, _scale()
        tr.section(f"the {SHOW} slowest tests and their budgets (tests/budget_plugin.py)")
        for n, t in sorted(self.times.items(), key=lambda x: -x[1])[:SHOW]:
            b = self.limits.get(n)
            tr.write_line(f"{t:8.1f} s  of {b * scale if b else float('nan'):6.1f} s  {n}")
        tr.write_line(f"{sum(self.times.values()):8.1f} s  all {len(self.times)} tests together "
                      f"(test time, not wall: workers overlap)")
        for n, t, b in self.over_budget():
            tr.write_line(f"OVER BUDGET: {n} took {t:.1f} s, its budget is {b:.1f} s (make it cheaper, or "
                          f"mark it @pytest.mark.budget(...) saying why)", red=True)

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session, exitstatus):
        dump = os.environ.get("GRPO_DIST_TEST_TIMES")
        if dump and not self.worker and self.times:
            with open(dump, "w") as f:
                json.dump(dict(sorted(self.times.items(), key=lambda x: -x[1])), f, indent=1)
        if not self.worker and exitstatus == 0 and self.over_budget():
            session.exitstatus = 1
