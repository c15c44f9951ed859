"""watchdog.store.run_rows.move, the one writer of runs.status, on both backends: a listed move
is a compare-and-set on the expected status; an unlisted one raises before anything is written."""

from __future__ import annotations

import datetime as dt

import pytest
from sqlalchemy import insert, select

from watchdog.core import lifecycle as lc
from watchdog.store import run_rows
from watchdog.store.schema import runs

T0 = dt.datetime(2026, 3, 2, 12, 0, tzinfo=dt.timezone.utc)
RID = "a" * 32


def _run(engine, status: str = lc.RUNNING, **extra) -> None:
    with engine.begin() as conn:
        conn.execute(insert(runs).values(id=RID, agent="bot", status=status, kill_mode="process", host="h1",
                                         started_at=T0, last_seen_at=T0, **extra))


def _status(engine) -> tuple:
    with engine.connect() as conn:
        r = conn.execute(select(runs.c.status, runs.c.stop_reason, runs.c.ended_at).where(runs.c.id == RID)).one()
    return r.status, r.stop_reason, r.ended_at


def test_a_listed_move_writes_the_status_and_its_values(engine):
    _run(engine)
    with engine.begin() as conn:
        assert run_rows.move(conn, RID, lc.STOPPING, was=lc.STOPPABLE_STATUSES, stop_reason=lc.MANUAL,
                             stop_requested_at=T0)
    assert _status(engine)[:2] == (lc.STOPPING, lc.MANUAL)


def test_a_move_from_another_status_than_expected_writes_nothing(engine):
    _run(engine, status=lc.PAUSED)
    with engine.begin() as conn:
        assert not run_rows.move(conn, RID, lc.COMPLETED, was=lc.RUNNING, ended_at=T0)
        assert not run_rows.move(conn, "z" * 32, lc.COMPLETED, was=lc.RUNNING, ended_at=T0)  # no such run
    assert _status(engine) == (lc.PAUSED, None, None)


def test_a_further_condition_must_hold_too(engine):
    _run(engine, status=lc.STOPPING, signal_stage=lc.Stage.TERM)
    with engine.begin() as conn:
        assert not run_rows.move(conn, RID, lc.KILLED, was=lc.STOPPING, when=runs.c.signal_stage.is_(None),
                                 ended_at=T0)
        assert run_rows.move(conn, RID, lc.KILLED, was=lc.STOPPING, when=runs.c.signal_stage == lc.Stage.TERM,
                             ended_at=T0)
    assert _status(engine)[0] == lc.KILLED


@pytest.mark.parametrize("was, to", [(lc.COMPLETED, lc.RUNNING), (lc.STOPPING, lc.RUNNING), (lc.LOST, lc.KILLED),
                                     ((lc.RUNNING, lc.KILLED), lc.STOPPING)])
def test_an_unlisted_move_raises_and_writes_nothing(engine, was, to):
    start = was[0] if isinstance(was, tuple) else was
    _run(engine, status=start)
    with engine.begin() as conn:
        with pytest.raises(run_rows.IllegalMove) as err:
            run_rows.move(conn, RID, to, was=was)
    assert "STATUS_MOVES" in str(err.value)
    assert _status(engine)[0] == start
