"""After a jump of the store's clock: the active runs' times moved onto the new clock.

A run that started 10 s before the clock was stepped +1 h is 10 s old, not 3,610 s; after
-1 h, its last_seen_at (kept by GREATEST) would sit an hour in the future and hide its
silence. Only the columns the daemon measures durations from, only active runs (a few
rows, once per jump), each row written only if no record changed it meanwhile; and the
next attempt of the alerts not delivered yet (after -1 h it would wait an hour).
"""

from __future__ import annotations

import datetime as dt
import functools
from collections.abc import Callable

from sqlalchemy import and_, select, update
from sqlalchemy.engine import Connection

from watchdog.core import lifecycle as lc
from watchdog.store.engine import store_unavailable
from watchdog.store.schema import alerts, runs

TIME_COLUMNS = ("started_at", "last_seen_at", "paused_at", "stop_requested_at")


def _each(conn: Connection, fn: Callable[[], int]) -> int:
    """`fn()` in a SAVEPOINT of its own: one row written by hand (a time that does not parse, or
    that the checks refuse) is left as it is and costs no other row its rebase."""
    try:
        with conn.begin_nested():
            return fn()
    except Exception as exc:  # noqa: BLE001
        if store_unavailable(exc):
            raise
        return 0


def rebase_active_runs(conn: Connection, rebased: Callable[[dt.datetime | None], dt.datetime | None]) -> int:
    """Apply `rebased` (watchdog.daemon.tick.clock.Jump.rebased) to the active runs' times; the rows changed."""
    cols = [runs.c[name] for name in TIME_COLUMNS]
    ids = conn.execute(select(runs.c.id).where(runs.c.status.in_(lc.ACTIVE_STATUSES))).scalars().all()

    def one(rid: str) -> int:
        row = conn.execute(select(runs.c.id, *cols).where(runs.c.id == rid)).first()
        if row is None:
            return 0
        values: dict[str, dt.datetime | None] = {}
        for name in TIME_COLUMNS:
            old = getattr(row, name)
            if old is None:
                continue
            if old.tzinfo is None:  # SQLite: naive UTC
                old = old.replace(tzinfo=dt.timezone.utc)
            new = rebased(old)
            if new != old:
                values[name] = new
        if not values:
            return 0
        # Unchanged since read: a record written meanwhile already carries the new clock's time.
        same = [runs.c[name] == getattr(row, name) for name in values]
        return conn.execute(update(runs).where(and_(runs.c.id == row.id, *same)).values(**values)).rowcount

    return sum(_each(conn, functools.partial(one, rid)) for rid in ids)


def rebase_pending_alerts(conn: Connection, rebased: Callable[[dt.datetime | None], dt.datetime | None]) -> int:
    """The same for the next attempt of the alerts not delivered yet; the rows changed."""
    ids = conn.execute(select(alerts.c.id).where(and_(alerts.c.delivered_at.is_(None),
                                                      alerts.c.next_attempt_at.is_not(None)))).scalars().all()

    def one(aid: int) -> int:
        row = conn.execute(select(alerts.c.id, alerts.c.next_attempt_at).where(alerts.c.id == aid)).first()
        if row is None or row.next_attempt_at is None:
            return 0
        old = row.next_attempt_at if row.next_attempt_at.tzinfo else row.next_attempt_at.replace(tzinfo=dt.timezone.utc)
        new = rebased(old)
        if new == old:
            return 0
        return conn.execute(update(alerts).where(and_(alerts.c.id == row.id,
                                                      alerts.c.next_attempt_at == row.next_attempt_at))
                            .values(next_attempt_at=new)).rowcount

    return sum(_each(conn, functools.partial(one, aid)) for aid in ids)
