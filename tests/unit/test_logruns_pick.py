"""Which hook run a session's log events count on, among the rows that claim it (logruns.pick):
on SQLite any writer can add a row that looks like the hook's, so the receiver never picks
among two of a kind."""

from __future__ import annotations

import pytest

from watchdog.daemon.otlp.logruns import SEVERAL, pick
from watchdog.store.hooks import HookRun

A, B = HookRun("a" * 32, "bot", True), HookRun("b" * 32, "bot", True)
A_STOPPED, B_STOPPED = HookRun("a" * 32, "bot", False), HookRun("b" * 32, "bot", False)


@pytest.mark.parametrize(("claims", "want"), [
    ([], None),
    ([A], A),
    ([A_STOPPED], A_STOPPED),  # the session's run is stopped: its events are refused
    ([A, B_STOPPED], A),  # a `failed` look-alike cannot blind the active run
    ([A, B], SEVERAL),  # a `running` look-alike cannot capture: neither gets them
    ([A_STOPPED, B_STOPPED], SEVERAL),
])
def test_one_claimant_or_the_only_active_one_else_none_of_them(claims, want):
    assert pick(claims) == want
