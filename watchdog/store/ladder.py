"""The stop ladder's writes and reads on a stopping run: its stage, and what its SIGTERM reached.

Every stage write checks `lifecycle.STAGE_MOVES` first (IllegalStageMove: a bug in the
caller, raised before anything is written) and is a compare-and-set on the stage the caller
read, so two daemons never take the same step twice. The transaction is the caller's.
"""

from __future__ import annotations

import datetime as dt
from typing import Any, NamedTuple

from sqlalchemy import and_, desc, select, update
from sqlalchemy.engine import Connection
from sqlalchemy.sql.elements import ColumnElement

from watchdog.core import lifecycle as lc
from watchdog.core.interventions import Action
from watchdog.store import run_rows
from watchdog.store.engine import bound_lock_waits
from watchdog.store.schema import interventions, runs


def _cond(expected: str | None) -> ColumnElement[bool]:
    return runs.c.signal_stage.is_(None) if expected is None else runs.c.signal_stage == expected


def _move(conn: Connection, run_id: str, expected: str | None, stage: str, values: dict[str, Any]) -> bool:
    lc.check_stage_move(expected, stage)
    res = conn.execute(update(runs).where(and_(runs.c.id == run_id, runs.c.status == lc.STOPPING, _cond(expected)))
                       .values(signal_stage=stage, **values))
    return bool(res.rowcount == 1)


def set_stage(conn: Connection, run_id: str, expected: str | None, stage: str, *, signalled_at: dt.datetime) -> bool:
    """expected -> stage on a stopping run, stamped `signalled_at`; False: the run is not at
    `expected` any more (another daemon moved it, or it ended)."""
    return _move(conn, run_id, expected, stage, {"signalled_at": signalled_at})


def finish(conn: Connection, run_id: str, expected: str | None, now: dt.datetime) -> bool:
    """expected -> done: the stopping run is killed, ended `now`; False as for set_stage."""
    lc.check_stage_move(expected, lc.Stage.DONE)
    return run_rows.move(conn, run_id, lc.KILLED, was=lc.STOPPING, when=_cond(expected), signal_stage=lc.Stage.DONE,
                         ended_at=now)


def sigterm_details(conn: Connection, run_id: str) -> list[Any]:
    """The `detail` of each `sigterm` intervention of the run, newest first (as stored: any
    store writer can insert such a row, the caller verifies each one's seal)."""
    return list(conn.execute(
        select(interventions.c.detail)
        .where(and_(interventions.c.run_id == run_id, interventions.c.action == Action.SIGTERM))
        .order_by(desc(interventions.c.id))).scalars())


class Locked(NamedTuple):
    """A run's stage and its process target, as read under its row lock."""

    status: str
    signal_stage: str | None
    host: str
    pid: int | None
    pid_create_time: float | None
    kill_mode: str


def stage_now(conn: Connection, run_id: str) -> Locked | None:
    """The run's status, stage and target (host, pid, pid_create_time, kill_mode), read under its
    row lock (FOR UPDATE on PostgreSQL; SQLite's writers hold the write lock from BEGIN IMMEDIATE):
    until the caller's transaction ends, no other daemon takes the same step, and the target
    cannot change under the step (watchdog.daemon.stops.enforcer). None: no such run.
    The wait for the lock is bounded (engine.bound_lock_waits): a run's writer may hold its own
    row locked in an idle transaction; past the bound this raises (engine.row_locked)."""
    bound_lock_waits(conn)
    r = conn.execute(select(runs.c.status, runs.c.signal_stage, runs.c.host, runs.c.pid, runs.c.pid_create_time,
                            runs.c.kill_mode).where(runs.c.id == run_id).with_for_update()).first()
    if r is None:
        return None
    return Locked(str(r.status), r.signal_stage or None, r.host, r.pid, r.pid_create_time, r.kill_mode)
