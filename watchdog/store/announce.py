"""One verb to announce an outcome (issue 34): record the intervention, word the alert from
the table of outcomes (watchdog.core.outcomes), seal it and queue it, in the caller's one
transaction, so a crash never leaves an alert without its record nor a record half-told.

This is the only caller of the outbox's enqueue: every stop, signal, pause, alarm and
circuit change the daemon tells a human goes through here, worded in one place.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any, NamedTuple

from watchdog.core.interventions import Action
from watchdog.core.outcomes import Outcome, word
from watchdog.core.seal import Sealer
from watchdog.store.alerts import enqueue_alert, queued
from watchdog.store.engine import Connection
from watchdog.store.interventions import record


@dataclass(frozen=True)
class Audit:
    """The intervention an announcement records (its run is the outcome's unless `run_id`)."""

    action: Action | str
    by: str
    reason: str | None = None
    outcome: str | None = None
    detail: Any = None
    tool: str | None = None
    at: dt.datetime | None = None  # when it happened, if not `now`
    run_id: str | None = None


class Announced(NamedTuple):
    intervention_id: int | None  # the audit row (recorded here, or the caller's)
    queued: bool  # the alert is in the outbox now (False: its key was queued before, or no sealer)


def announce(conn: Connection, o: Outcome, *, now: dt.datetime, sealer: Sealer | None,
             audit: Audit | int | None = None, once: bool = False) -> Announced:
    """Record `audit` (an Audit to write, or the id of the row the caller's state change wrote),
    word `o` and queue its alert sealed, once per key ever. `once`: if the key was queued
    before, nothing at all is recorded (the outcome was announced already)."""
    if once and queued(conn, o.key):
        return Announced(None, False)
    if isinstance(audit, Audit):
        iid: int | None = record(conn, at=audit.at or now, action=audit.action, by=audit.by,
                                 run_id=audit.run_id or o.run_id, tool=audit.tool, reason=audit.reason,
                                 detail=audit.detail, outcome=audit.outcome)
    else:
        iid = audit
    if sealer is None:  # not the daemon: it words nothing (it will when it sees the record)
        return Announced(iid, False)
    title, body = word(o)
    return Announced(iid, enqueue_alert(conn, o.key, title, body, now=now, run_id=o.run_id, intervention_id=iid,
                                        sealer=sealer))
