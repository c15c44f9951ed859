"""Runs whose row another session holds locked (PostgreSQL): passed over this tick, tried again
at every next one, reported once.

Any confined login may `SELECT ... FOR UPDATE` its own run and leave the transaction open. The
daemon's statements wait for such a lock at most engine.DAEMON_LOCK_TIMEOUT_MS (their
transactions call engine.bound_lock_waits), and that run's step is rolled back to its SAVEPOINT
alone: every other run of the tick is judged and stopped as usual. The locked run stays looked
at (sticky, like an unreadable one) so that the step is taken the first tick after the lock
goes; until then nothing of it can be written (its stop, its audit row, an alert naming it:
each insert's foreign key waits on the same row). So the report says so without naming the run
in a column: a log line at the first miss, and one alert (key `locked:<run>`, once ever) when
the row is still locked at the next tick, with the run id as the daemon reads it (marked unless
of the generated form). Its process is not signalled meanwhile (see docs/explanation/security.md,
"A run that holds its own row locked").
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from watchdog.core.alert_kinds import AlertKind
from watchdog.core.outcomes import Outcome, Say
from watchdog.core.text import one_line
from watchdog.daemon.tick.batch import Batch
from watchdog.daemon.tick.tickstate import ThisTick
from watchdog.store.alerts import announce
from watchdog.store.engine import DAEMON_LOCK_TIMEOUT_MS, store_unavailable

if TYPE_CHECKING:
    from watchdog.daemon.context import TickContext

log = logging.getLogger("watchdog.tick")

ALERT_AFTER_TICKS = 2  # a lock that outlives one tick is no writer's short transaction


def held(tk: TickContext, this: ThisTick, row: Any, batch: Batch) -> None:
    """The run's step gave up on its row lock this tick: remembered, logged once, alerted once."""
    rid = row.id
    ticks = tk.state.locked.get(rid, 0) + 1
    tk.state.locked[rid] = ticks
    this.rep.locked.append(rid)
    if ticks == 1:
        log.warning("run %s (%s): its row is locked by another session; its step waits, tried again each tick",
                    one_line(rid, 40), one_line(str(row.status), 16))
    if ticks != ALERT_AFTER_TICKS or tk.sealer is None:
        return
    said = Outcome.of(Say.ROW_LOCKED, AlertKind.LOCKED.key(rid), None, run_id=rid, status=str(row.status),
                      waited_ms=DAEMON_LOCK_TIMEOUT_MS, ticks=ticks)
    try:
        with batch.run() as conn:  # no run_id column: its foreign key would wait on the same lock
            announce(conn, said, now=this.now, sealer=tk.sealer, once=True)
    except Exception as exc:  # noqa: BLE001 — the log line said it; never at the other runs' expense
        if store_unavailable(exc):
            raise
        log.warning("run %s: could not queue its locked-row alert (%s)", one_line(rid, 40), type(exc).__name__)


def released(tk: TickContext, row: Any) -> None:
    """The run's step went through: its lock is gone (said once in the log)."""
    if tk.state.locked.pop(row.id, None) is not None:
        log.warning("run %s: its row lock is released; its step is taken", one_line(row.id, 40))
