"""After a jump of the store's clock: the active runs' times moved onto the new clock.

A run that started 10 s before the clock was stepped +1 h is 10 s old, not 3,610 s; after
-1 h, its last_seen_at (kept by GREATEST) would sit an hour in the future and hide its
silence. Only the columns the daemon measures durations from, only active runs (a few
rows, once per jump), each row written only if no record changed it meanwhile; and the
next attempt of the alerts not delivered yet (after -1 h it would wait an hour).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable

from sqlalchemy import and_, select, update

from watchdog.core import lifecycle as lc
from watchdog.store.schema import alerts, runs

TIME_COLUMNS = ("started_at", "last_seen_at", "paused_at", "stop_requested_at")


def rebase_active_runs(conn, rebased: Callable[[dt.datetime | None], dt.datetime | None]) -> int:
    """Apply `rebased` (watchdog.daemon.clock.Jump.rebased) to the active runs' times; the rows changed."""
    cols = [runs.c[name] for name in TIME_COLUMNS]
    changed = 0
    for row in conn.execute(select(runs.c.id, *cols).where(runs.c.status.in_(lc.ACTIVE_STATUSES))).all():
        values = {}
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
            continue
        # Unchanged since read: a record written meanwhile already carries the new clock's time.
        same = [runs.c[name] == getattr(row, name) for name in values]
        done = conn.execute(update(runs).where(and_(runs.c.id == row.id, *same)).values(**values))
        changed += done.rowcount
    return changed


def rebase_pending_alerts(conn, rebased: Callable[[dt.datetime | None], dt.datetime | None]) -> int:
    """The same for the next attempt of the alerts not delivered yet; the rows changed."""
    changed = 0
    pending = select(alerts.c.id, alerts.c.next_attempt_at).where(and_(alerts.c.delivered_at.is_(None),
                                                                        alerts.c.next_attempt_at.is_not(None)))
    for row in conn.execute(pending).all():
        old = row.next_attempt_at if row.next_attempt_at.tzinfo else row.next_attempt_at.replace(tzinfo=dt.timezone.utc)
        new = rebased(old)
        if new != old:
            changed += conn.execute(update(alerts).where(and_(alerts.c.id == row.id,
                                                              alerts.c.next_attempt_at == row.next_attempt_at))
                                    .values(next_attempt_at=new)).rowcount
    return changed
