"""The SDK's pre-rendered status writes (agent_writes, lineage) skip watchdog.store.run_rows.move on
their hot path: each fixed move is checked against lifecycle.STATUS_MOVES once, when its SQL is
rendered, so an illegal one fails at build time, not on some run's record."""

from __future__ import annotations

import pytest

from watchdog.core import lifecycle as lc
from watchdog.store import dialects
from watchdog.store.agent_writes import END_STATUSES, AgentSQL
from watchdog.store.lineage import Lineage, _stop_request_sql, status_move_sql

BACKENDS = ("sqlite", "postgresql")


@pytest.mark.parametrize("to, was", [(lc.RUNNING, lc.STOPPING), (lc.PAUSED, lc.STOPPING),
                                     (lc.RUNNING, lc.KILLED), (lc.LOST, lc.COMPLETED),
                                     (lc.STOPPING, (lc.RUNNING, lc.PAUSED, lc.FAILED))])
def test_an_illegal_fixed_move_fails_when_rendered(to, was):
    with pytest.raises(lc.IllegalStatusMove) as err:
        status_move_sql(to, was, "stop_reason = ?", "?")
    assert err.value.new == to


def test_a_move_from_nothing_is_refused():
    with pytest.raises(ValueError):
        status_move_sql(lc.STOPPING, (), "stop_reason = ?", "?")


def test_a_legal_move_renders_its_compare_and_set():
    assert status_move_sql(lc.STOPPING, lc.PAUSED, "stop_requested_at = ?", "?") == (
        "UPDATE runs SET status = 'stopping', stop_requested_at = ? WHERE id = ? AND status = 'paused'")
    assert status_move_sql(lc.STOPPING, (lc.RUNNING, lc.PAUSED), "stop_reason = %s", "%s") == (
        "UPDATE runs SET status = 'stopping', stop_reason = %s WHERE id = %s AND status IN ('running', 'paused')")


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_sdk_moves_are_the_ones_the_table_lists(backend):
    d = dialects.for_name(backend)
    lineage = Lineage(d, "r1", ("p1",))
    # (statement, to, from): what the guard's pause, an unanswered pause and a guard's stop write.
    for sql, to, was in ((lineage.pause_sql, lc.PAUSED, lc.RUNNING), (lineage.give_up_sql, lc.STOPPING, lc.PAUSED),
                         (_stop_request_sql(d), lc.STOPPING, lc.RUNNING)):
        assert sql.startswith(f"UPDATE runs SET status = '{to}', ")
        assert sql.endswith(f"WHERE id = {d.ph} AND status = '{was}'")
        lc.check_status_move(was, to)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_run_ends_itself_only_as_end_run_was_checked_for(backend):
    sql = AgentSQL(dialects.for_name(backend))
    for status in END_STATUSES:
        for current in lc.ACTIVE_STATUSES:
            lc.check_status_move(current, status)
        text, params = sql.end("r1", status, None, None, None)
        assert text == sql.end_run and params[0] == status and params[-1] == "r1"
    for status in (lc.LOST, lc.RUNNING, lc.PAUSED, lc.STOPPING, "done"):
        with pytest.raises(lc.IllegalStatusMove):
            sql.end("r1", status, None, None, None)
