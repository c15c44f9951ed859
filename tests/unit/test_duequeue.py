"""The due-queue and the deadlines it holds (watchdog.daemon.tick.duequeue, watchdog.core.deadlines):
pure, no store, no clock of their own. The deadlines are checked against the policies
themselves: one instant before a deadline the rule does not trip, at it, it does."""

from __future__ import annotations

import dataclasses
import datetime as dt
import math
from collections.abc import Mapping
from dataclasses import dataclass, field

import pytest

from watchdog.core import lifecycle as lc
from watchdog.core.budgets import Budgets
from watchdog.core.config import DaemonConfig
from watchdog.core.deadlines import Deadline, deadlines, next_deadline, next_period_boundary
from watchdog.core.periods import zone
from watchdog.core.policies import RunSnapshot, evaluate
from watchdog.daemon.tick.duequeue import Due, DueQueue, Why


@dataclass(frozen=True)
class Row:
    status: str = lc.RUNNING
    started_s: float | None = 1000.0
    seen_s: float | None = 1100.0
    stop_requested_s: float | None = None
    signalled_s: float | None = None
    paused_s: float | None = None
    signal_stage: str | None = None
    asked: Mapping[str, float] = field(default_factory=dict)


PROF = Budgets(max_wall_s=300.0, heartbeat_timeout_s=120.0, approval_timeout_s=900.0)
DAEMON = DaemonConfig(tick_s=5.0, cancel_grace_s=10.0, term_grace_s=5.0)


def test_why_is_a_str_enum_of_the_five_reasons():
    assert [w.value for w in Why] == ["wall_clock", "silence", "approval_timeout", "ladder_step", "period_boundary"]
    assert Why.SILENCE == "silence" and isinstance(Why.WALL_CLOCK, str)


def test_pop_due_returns_what_is_due_soonest_first_and_removes_it():
    q = DueQueue()
    q.push("c", 30.0, Why.SILENCE)
    q.push("a", 10.0, Why.WALL_CLOCK)
    q.push("b", 20.0, Why.LADDER_STEP)
    assert len(q) == 3 and q.peek() == 10.0
    assert q.pop_due(9.99) == []
    assert q.pop_due(20.0) == [Due(10.0, "a", Why.WALL_CLOCK), Due(20.0, "b", Why.LADDER_STEP)]
    assert len(q) == 1 and "a" not in q and "c" in q
    assert q.pop_due(1e9) == [Due(30.0, "c", Why.SILENCE)]
    assert q.pop_due(1e9) == [] and q.peek() is None and len(q) == 0


def test_a_push_for_the_same_run_and_reason_moves_it_other_reasons_stay():
    q = DueQueue()
    q.push("a", 10.0, Why.SILENCE)
    q.push("a", 50.0, Why.SILENCE)  # a new record moved its silence deadline
    q.push("a", 40.0, Why.WALL_CLOCK)
    assert len(q) == 2
    assert q.deadlines("a") == [Due(40.0, "a", Why.WALL_CLOCK), Due(50.0, "a", Why.SILENCE)]
    assert q.pop_due(45.0) == [Due(40.0, "a", Why.WALL_CLOCK)]
    q.push("a", 5.0, Why.SILENCE)  # moved earlier too
    assert q.pop_due(45.0) == [Due(5.0, "a", Why.SILENCE)] and len(q) == 0


def test_discard_forgets_one_reason_or_the_whole_run():
    q = DueQueue()
    q.push("a", 10.0, Why.SILENCE)
    q.push("a", 20.0, Why.WALL_CLOCK)
    q.push("b", 15.0, Why.SILENCE)
    q.discard("a", Why.SILENCE)
    assert q.deadlines("a") == [Due(20.0, "a", Why.WALL_CLOCK)] and len(q) == 2
    q.discard("a")
    q.discard("nobody")
    assert "a" not in q and q.pop_due(100.0) == [Due(15.0, "b", Why.SILENCE)]


def test_reschedule_replaces_every_deadline_of_a_run():
    q = DueQueue()
    q.push("a", 10.0, Why.SILENCE)
    q.push("a", 20.0, Why.WALL_CLOCK)
    q.reschedule("a", [Deadline(99.0, Why.LADDER_STEP)])
    assert q.deadlines("a") == [Due(99.0, "a", Why.LADDER_STEP)]
    q.reschedule("a", [])
    assert "a" not in q and len(q) == 0 and q.peek() is None


def test_a_clock_jump_moves_every_deadline_by_the_jump():
    q = DueQueue()
    q.push("a", 100.0, Why.SILENCE)
    q.push("b", 200.0, Why.WALL_CLOCK)
    q.shift(3600.0)  # the wall clock jumped an hour forward: nothing comes due by the jump
    assert q.pop_due(3650.0) == [] and q.peek() == 3700.0
    q.push("c", 3650.0, Why.LADDER_STEP)  # pushed after the jump, on the new clock
    q.shift(-1800.0)  # and half of it back
    assert q.pop_due(1900.0) == [Due(1850.0, "c", Why.LADDER_STEP), Due(1900.0, "a", Why.SILENCE)]
    assert q.deadlines("b") == [Due(2000.0, "b", Why.WALL_CLOCK)]
    with pytest.raises(ValueError):
        q.shift(math.inf)


def test_a_deadline_that_is_not_a_number_is_refused():
    q = DueQueue()
    for bad in (math.nan, math.inf, -math.inf):
        with pytest.raises(ValueError):
            q.push("a", bad, Why.SILENCE)
    assert len(q) == 0


def test_many_moves_keep_the_heap_small_and_lose_nothing():
    q = DueQueue()
    for k in range(10_000):
        q.push(f"r{k % 100}", float(k), Why.SILENCE)  # each run's deadline moved 100 times
    assert len(q) == 100 and len(q._heap) <= 2 * 100 + 64 + 1
    due = q.pop_due(1e9)
    assert [d.run_id for d in due] == [f"r{k}" for k in range(100)]
    assert [d.at_s for d in due] == [float(9900 + k) for k in range(100)]


# --- the deadlines, against the policies ------------------------------------------------------


def _snap(row: Row, steps: int = 0) -> RunSnapshot:
    assert row.started_s is not None and row.seen_s is not None
    utc = dt.timezone.utc
    return RunSnapshot(id="r", agent="bot", started_at=dt.datetime.fromtimestamp(row.started_s, utc),
                       last_seen_at=dt.datetime.fromtimestamp(row.seen_s, utc), steps=steps, tool_calls=0,
                       tool_errors=0, cost_eur=0.0)


def _reasons(row: Row, prof: Budgets, at_s: float) -> set[str]:
    return {v.reason for v in evaluate(_snap(row), prof, dt.datetime.fromtimestamp(at_s, dt.timezone.utc))}


def test_a_running_runs_deadlines_are_where_its_clock_rules_trip():
    row = Row(started_s=1000.0, seen_s=1250.0)
    found = deadlines(row, PROF, DAEMON, now_s=1260.0)
    assert [d.why for d in found] == [Why.WALL_CLOCK, Why.SILENCE]
    wall, silence = found
    assert wall.at_s == pytest.approx(1300.0) and silence.at_s == pytest.approx(1370.0)
    # Just before each deadline its rule is silent; at it, it trips (datetimes round to the µs).
    assert lc.WALL_CLOCK not in _reasons(row, PROF, wall.at_s - 1e-3) and lc.WALL_CLOCK in _reasons(
        row, PROF, wall.at_s + 1e-6)
    assert lc.HEARTBEAT_TIMEOUT not in _reasons(row, PROF, silence.at_s - 1e-3)
    assert lc.HEARTBEAT_TIMEOUT in _reasons(row, PROF, silence.at_s + 1e-6)
    assert next_deadline(row, PROF, DAEMON, 1260.0) == wall


def test_the_runs_own_lower_budgets_and_the_daemons_first_sight_count():
    row = Row(started_s=1000.0, seen_s=1000.0, asked={"max_wall_s": 60.0, "heartbeat_timeout_s": 30.0})
    at = {d.why: d.at_s for d in deadlines(row, PROF, DAEMON, 1000.0)}
    assert at == {Why.WALL_CLOCK: pytest.approx(1060.0), Why.SILENCE: pytest.approx(1030.0)}
    # A run may not raise its own budgets (unless resumed or its profile allows it).
    higher = Row(started_s=1000.0, seen_s=1000.0, asked={"max_wall_s": 9999.0})
    assert next(d for d in deadlines(higher, PROF, DAEMON, 0.0) if d.why == Why.WALL_CLOCK).at_s == pytest.approx(1300.0)
    raised = deadlines(higher, PROF, DAEMON, 0.0, raised=True)
    assert next(d for d in raised if d.why == Why.WALL_CLOCK).at_s == pytest.approx(10999.0)
    # A started_at written later than the daemon first saw the run: the wall clock runs from first sight.
    late = Row(started_s=5000.0, seen_s=5000.0)
    assert next(d for d in deadlines(late, PROF, DAEMON, 0.0, first_seen_s=1000.0)
                if d.why == Why.WALL_CLOCK).at_s == pytest.approx(1300.0)


def test_a_row_without_a_readable_time_is_due_at_once():
    assert {d.at_s for d in deadlines(Row(started_s=None, seen_s=None), PROF, DAEMON, 50.0)} == {0.0}


def test_a_paused_run_waits_for_its_approval_and_still_for_its_silence():
    row = Row(status=lc.PAUSED, seen_s=1000.0, paused_s=1010.0)
    found = deadlines(row, PROF, DAEMON, 1020.0)
    assert [(d.why, d.at_s) for d in found] == [(Why.SILENCE, pytest.approx(1120.0)),
                                                (Why.APPROVAL_TIMEOUT, 1910.0)]
    # The daemon's own record of the pause wins over the row's paused_at (issue 20).
    own = deadlines(row, PROF, DAEMON, 1020.0, pause_since_s=1500.0)
    assert (Why.APPROVAL_TIMEOUT, 2400.0) in [(d.why, d.at_s) for d in own]


def test_a_stopping_runs_ladder_steps():
    asked = Row(status=lc.STOPPING, stop_requested_s=2000.0)
    assert deadlines(asked, PROF, DAEMON, 2001.0) == [Deadline(2010.0, Why.LADDER_STEP)]
    termed = dataclasses.replace(asked, signal_stage=lc.Stage.TERM, signalled_s=2010.0)
    assert deadlines(termed, PROF, DAEMON, 2011.0) == [Deadline(2015.0, Why.LADDER_STEP)]
    killed = dataclasses.replace(asked, signal_stage=lc.Stage.KILL, signalled_s=2015.0)
    assert deadlines(killed, PROF, DAEMON, 2016.0) == [Deadline(2021.0, Why.LADDER_STEP)]  # a tick later


def test_ended_runs_have_no_deadline():
    for status in (lc.COMPLETED, lc.FAILED, lc.KILLED, lc.LOST):
        assert deadlines(Row(status=status), PROF, DAEMON, 0.0) == []
        assert next_deadline(Row(status=status), PROF, DAEMON, 0.0) is None


def test_the_period_boundary_is_the_end_of_the_budget_day():
    tz = zone("Europe/Paris")
    now = dt.datetime(2026, 3, 28, 23, 30, tzinfo=dt.timezone.utc)  # 00:30 on the 29th in Paris (DST day)
    end = next_period_boundary(now, tz)
    assert dt.datetime.fromtimestamp(end, dt.timezone.utc) == dt.datetime(2026, 3, 29, 22, 0, tzinfo=dt.timezone.utc)
    found = deadlines(Row(started_s=now.timestamp(), seen_s=now.timestamp()), PROF, DAEMON, now.timestamp(),
                      period_end_s=end)
    assert (Why.PERIOD_BOUNDARY, end) in [(d.why, d.at_s) for d in found]


def test_a_deadline_moved_later_waits_there_without_a_heap_push_and_one_moved_earlier_comes_first() -> None:
    q = DueQueue()
    q.push("a", 100.0, Why.SILENCE)
    q.push("b", 150.0, Why.WALL_CLOCK)
    heap_size = len(q._heap)
    for at_s in (110.0, 120.0, 200.0):  # a run that keeps writing: its silence moves later each time
        q.reschedule("a", [Deadline(at_s, Why.SILENCE)])
    assert len(q._heap) == heap_size  # no entry per move
    assert q.peek() == 150.0 and len(q) == 2
    assert q.pop_due(199.0) == [Due(150.0, "b", Why.WALL_CLOCK)]  # not at a's old times
    assert q.pop_due(200.0) == [Due(200.0, "a", Why.SILENCE)]
    q.push("c", 300.0, Why.SILENCE)
    q.reschedule("c", [Deadline(250.0, Why.WALL_CLOCK)])  # another reason, earlier: the old one goes
    q.push("c", 240.0, Why.WALL_CLOCK)  # earlier still
    assert q.deadlines("c") == [Due(240.0, "c", Why.WALL_CLOCK)] and len(q) == 1
    assert q.pop_due(1000.0) == [Due(240.0, "c", Why.WALL_CLOCK)] and len(q) == 0 and q.peek() is None
