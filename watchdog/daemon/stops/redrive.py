"""A stop that must not stay stranded in `stopping` (issue 36): a signal the kernel refused for
lack of permission is retried, and an operator's sealed `kill` drives a stuck stop again.

EPERM says nothing about the run: it is the daemon that lacks CAP_KILL (a unit without it, a
start by hand without `setpriv --ambient-caps +kill`). Such a stop keeps its stage (NULL), so
the ladder tries again each tick, and signals as soon as a daemon with the capability looks
(the same one after a fix, or its successor after a restart). Recorded and alerted once.

A stop refused for another reason (a user outside allowed_users, an identity not attested)
waits for its process (`refused`); after the operator fixed the cause, `agent-watchdog kill`
as root or the daemon's user writes a sealed `redrive:<run>:<time>` alert, which this daemon
reads as its own word: the ladder's first step is taken again, once per such alert.
"""

from __future__ import annotations

import datetime as dt
import logging
from typing import Any

from watchdog.core import lifecycle as lc
from watchdog.core.outcomes import AlertKind, Outcome, Say
from watchdog.core.budgets import Budgets
from watchdog.core.interventions import Action
from watchdog.core.messages import RunFacts
from watchdog.core.seal import Sealer
from watchdog.daemon.stops.signalcheck import FIX
from watchdog.store import run_rows
from watchdog.store.alerts import queued, Audit, announce
from watchdog.store.engine import Connection
from watchdog.store.run_rows import redrive_alerts

log = logging.getLogger("watchdog.tick")

DENIED = "not signalled: permission denied (the daemon lacks CAP_KILL); retried each tick"
REDRIVEN = "stop driven again by the operator; the daemon takes the ladder's first step again at its next tick"


def hold_denied(conn: Connection, row: Any, *, now: dt.datetime, by: str, facts: RunFacts, budgets: Budgets,
                sealer: Sealer | None = None) -> None:
    """The kernel refused the signal (EPERM): the stage stays, the ladder retries each tick.
    One intervention, one alert and one log line per run, however many ticks it takes."""
    key = AlertKind.DENIED.key(row.id)
    if queued(conn, key):
        return
    log.warning("run %s: the signal was refused (permission denied); retried each tick; %s", row.id[:8], FIX)
    announce(conn, Outcome.of(Say.ESCALATION, key, row.id, f=facts, b=budgets, reason=row.stop_reason, outcome=DENIED,
                              failed=True),
             now=now, sealer=sealer, audit=Audit(Action.SIGNAL_HELD, by, reason=row.stop_reason, outcome=DENIED))


def denied_before(conn: Connection, run_id: str) -> bool:
    """Whether a signal of this run was refused for permission (its alert is queued)."""
    return queued(conn, AlertKind.DENIED.key(run_id))


def request(conn: Connection, row: Any, *, now: dt.datetime, by: str, facts: RunFacts, budgets: Budgets,
            sealer: Sealer) -> str:
    """The operator's side (`kill` of a run already stopping, with the daemon's key): the audit
    row, the sealed alert the daemon obeys, and the run numbered as changed. Its dedupe key."""
    key = AlertKind.REDRIVE.key(row.id, now.strftime("%Y%m%dT%H%M%S.%f"))
    announce(conn, Outcome.of(Say.REDRIVE, key, row.id, f=facts, b=budgets, reason=row.stop_reason, outcome=REDRIVEN),
             now=now, sealer=sealer, audit=Audit(Action.STOP_REDRIVEN, by, reason=row.stop_reason, outcome=REDRIVEN))
    run_rows.touch(conn, row.id)
    return key


def sealed(sealer: Sealer | None, conn: Connection, row: Any) -> tuple[str, dt.datetime | None] | None:
    """(key, time) of the newest redrive alert of the run whose seal verifies, or None."""
    if sealer is None:
        return None
    try:
        found = redrive_alerts(conn, row.id)
    except Exception as exc:  # noqa: BLE001 — a hand-written row (SQLite: a time that is no time) drives nothing
        from watchdog.store.engine import store_unavailable

        if store_unavailable(exc):
            raise
        return None
    for a in found:
        if isinstance(a.body, str) and sealer.alert_ok(a.mac, a.dedupe_key, a.title, a.body, a.created_at):
            return a.dedupe_key, a.created_at
    return None


def pending(sealer: Sealer | None, conn: Connection, row: Any, done: set[str]) -> str | None:
    """For a run whose signal was refused: the key of a sealed redrive this daemon has not
    carried out yet (`done`: the keys it did), or None."""
    if row.signal_stage != lc.Stage.REFUSED:
        return None
    found = sealed(sealer, conn, row)
    if found is None or found[0] in done:
        return None
    return found[0]
