"""The alerts a daemon queues (`alerts` by dedupe key) and the one verb that announces an outcome.

The outbox's writes and reads by dedupe key: an alert is queued once per key, ever, sealed
with the daemon's key; the deciders ask what was queued before (when, and with what seal:
the caller verifies the MAC, any store writer can insert an alert row).

Only a daemon composes what reaches a human: without a sealer nothing is queued.

One verb to announce an outcome (issue 34): record the intervention, word the alert from
the table of outcomes (watchdog.core.outcomes), seal it and queue it, in the caller's one
transaction, so a crash never leaves an alert without its record nor a record half-told.

This is the only caller of the outbox's enqueue: every stop, signal, pause, alarm and
circuit change the daemon tells a human goes through here, worded in one place.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any, NamedTuple

from sqlalchemy import insert, select
from sqlalchemy.engine import Connection

from watchdog.core.alert_kinds import AlertKind
from watchdog.core.alert_text import alert_body, alert_title
from watchdog.core.interventions import Action
from watchdog.core.outcomes import Outcome, word
from watchdog.core.seal import Sealer
from watchdog.store.interventions import record
from watchdog.store.schema import alerts


KEY_CHARS = 255  # alerts.dedupe_key's width: longer keys are stored cut


class SealedAlert(NamedTuple):
    """An alert row as its seal covers it (values as stored: any writer may have put them there)."""

    dedupe_key: str
    title: Any
    body: Any
    mac: Any
    created_at: dt.datetime


def stop_key(run_id: str) -> str:
    """The key of a run's one stop alert: its row is the store's record that the stop was heard."""
    return AlertKind.STOP.key(run_id)[:KEY_CHARS]


def queued(conn: Connection, key: str) -> bool:
    """An alert with this dedupe key is (or was) in the outbox."""
    return conn.execute(select(alerts.c.id).where(alerts.c.dedupe_key == key[:KEY_CHARS])).first() is not None


def enqueue_alert(conn: Connection, key: str, title: str, body: str, *, now: dt.datetime, run_id: str | None = None,
                  intervention_id: int | None = None, sealer: Sealer | None = None) -> bool:
    """Put an alert in the outbox once per key, ever; False if that key was already queued.

    Sealed with the daemon's key (`sealer`): the outbox delivers nothing it cannot verify,
    so only a daemon composes what reaches a human. Without a sealer (a caller that is not
    the daemon) nothing is queued. Title and body are bounded before they are sealed: what
    is stored is what goes out (watchdog.core.alert_text)."""
    if sealer is None:
        return False
    key, title, body = key[:KEY_CHARS], alert_title(title), alert_body(body)
    if queued(conn, key):
        return False
    conn.execute(insert(alerts).values(
        dedupe_key=key, title=title, body=body, created_at=now, run_id=run_id,
        intervention_id=intervention_id, attempts=0, next_attempt_at=now, delivered_targets=[],
        sealed_by=sealer.host, mac=sealer.alert(key, title, body, now)))
    return True


def summarised(conn: Connection, run_id: str, title: str, body: str, *, now: dt.datetime,
               intervention_id: int | None, sealer: Sealer, summary_key: str) -> None:
    """The run's own stop alert row, written as already told through the summary `summary_key`:
    the outbox never sends it, `alerts --all` shows it, and it marks the stop as heard."""
    key, title, body = stop_key(run_id), alert_title(title), alert_body(body)
    conn.execute(insert(alerts).values(
        dedupe_key=key, title=title, body=body, created_at=now, run_id=run_id, intervention_id=intervention_id,
        attempts=0, next_attempt_at=None, delivered_targets=[], delivered_at=now,
        last_error=f"summarised in {summary_key}"[:200], sealed_by=sealer.host, mac=sealer.alert(key, title, body, now)))


def unheard(conn: Connection, run_ids: list[str]) -> set[str]:
    """Of `run_ids`, those whose stop has no alert row (queued, sent or summarised) yet."""
    if not run_ids:
        return set()
    keys = {stop_key(r): r for r in run_ids}
    alerted = {k for (k,) in conn.execute(select(alerts.c.dedupe_key).where(alerts.c.dedupe_key.in_(list(keys))))}
    return {r for k, r in keys.items() if k not in alerted}


def queued_at(conn: Connection, key: str) -> dt.datetime | None:
    """When the alert of this dedupe key was queued; None if it never was."""
    at: dt.datetime | None = conn.execute(
        select(alerts.c.created_at).where(alerts.c.dedupe_key == key[:KEY_CHARS])).scalar()
    return at


def by_key(conn: Connection, key: str) -> SealedAlert | None:
    """The alert row of this dedupe key, with what its seal covers."""
    a = conn.execute(select(alerts.c.dedupe_key, alerts.c.title, alerts.c.body, alerts.c.mac, alerts.c.created_at)
                     .where(alerts.c.dedupe_key == key[:KEY_CHARS])).first()
    return None if a is None else SealedAlert(*a)


# -- One verb to announce an outcome (issue 34): record the intervention, word the alert from ------------

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
