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
from watchdog.daemon.tick.tickstate import ThisTick, TickState
from watchdog.store.alerts import announce
from watchdog.store.engine import DAEMON_LOCK_TIMEOUT_MS, store_unavailable

if TYPE_CHECKING:
    from watchdog.daemon.context import TickContext

log = logging.getLogger("watchdog.tick")

ALERT_AFTER_TICKS = 2  # a lock that outlives one tick is no writer's short transaction
# Past this many lock waits given up in one tick, the runs known locked are not tried again this
# tick (2 s at 250 ms): a login holding many of its runs' rows slows a tick by this at most. They
# come last in the tick, least recently tried first, so each is tried again within a few ticks.
MAX_WAITS_PER_TICK = 8


def order(state: TickState, rows: list[Any]) -> list[Any]:
    """The runs in judging order: every other run first, then those known locked, least recently
    tried first (the waits spent on them never delay another run's stop)."""
    if not state.locked:
        return rows
    free = [r for r in rows if r.id not in state.locked]
    held_rows = sorted((r for r in rows if r.id in state.locked), key=lambda r: state.locked_tried.get(r.id, 0))
    return free + held_rows


def skipped(tk: TickContext, this: ThisTick, row: Any) -> bool:
    """A run known locked, once this tick's waits are spent: not tried now (it stays looked at,
    and goes first among the locked at a later tick)."""
    if this.lock_waits < MAX_WAITS_PER_TICK or row.id not in tk.state.locked:
        return False
    this.rep.locked.append(row.id)
    return True


def held(tk: TickContext, this: ThisTick, row: Any, batch: Batch) -> None:
    """The run's step gave up on its row lock this tick: remembered, logged once, alerted once."""
    rid, st = row.id, tk.state
    ticks = st.locked.get(rid, 0) + 1
    st.locked[rid] = ticks
    st.locked_tries += 1
    st.locked_tried[rid] = st.locked_tries
    this.lock_waits += 1
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
    tk.state.locked_tried.pop(row.id, None)
    if tk.state.locked.pop(row.id, None) is not None:
        log.warning("run %s: its row lock is released; its step is taken", one_line(row.id, 40))
