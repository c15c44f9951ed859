"""A pytest plugin: under CI (CI=true) a skipped test is a failed test.

A skip that is harmless on a laptop (no systemd-analyze, an extra not installed)
would let CI pass without ever running the test. CI installs everything the suite
needs (see .ci/run), so there a skip can only mean something is missing: say what.
Loaded by conftest.py; tested by tests/system/test_noskip.py.
"""

from __future__ import annotations

import os

import pytest


def strict() -> bool:
    return os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")


def _fail_the_skip(report) -> None:
    if not strict() or not report.skipped or hasattr(report, "wasxfail"):
        return
    reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
    report.outcome = "failed"
    report.longrepr = f"skipped under CI=true, where every test must run: {reason}"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    _fail_the_skip(outcome.get_result())


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    outcome = yield
    _fail_the_skip(outcome.get_result())  # a module-level skip (importorskip) fails its whole module
