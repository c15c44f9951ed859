"""One outcome in the store: its audit row (`interventions`: written, believed, the quarantine's reads), its
alert (`alerts` by dedupe key), and the one verb that announces it.

The audit rows (`interventions`): written, believed, and the quarantine's reads of them.

The audit rows (`interventions`): every stop, signal, pause and circuit change is one,
written in the same transaction as the state change it records, so a crash never leaves a
stop without its record. And what the daemon believes of them: a resume counts only with
the daemon's seal, an owner only from a sealed attestation.

The reads the quarantine of malformed rows makes before it records one (its writes are an
intervention and an alert: watchdog.store.alerts, watchdog.store.alerts).

The alerts a daemon queues (`alerts` by dedupe key) and the one verb that announces an outcome.

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
import json
import os
import re
import socket
from dataclasses import dataclass
from typing import Any, NamedTuple

from sqlalchemy import insert, select, and_, desc, update
from sqlalchemy.engine import Connection

from watchdog.core.outcomes import AlertKind, alert_body, alert_title, Outcome, word
from watchdog.core.budgets import RUN_BUDGET_KEYS
from watchdog.core.interventions import Action
from watchdog.core.seal import Sealer
from watchdog.store.schema import alerts, attestations, interventions, runs, WHOLE_RUN


GRANT_TAG = "sealed grant/1 "
_GRANT = re.compile(r"sealed grant/1 ([0-9a-f]{64})")


def actor(kind: str = "daemon") -> str:
    """Who writes an audit row: `<kind>@<host>:<pid>`."""
    return f"{kind}@{socket.gethostname()}:{os.getpid()}"


def record(conn: Connection, *, at: dt.datetime, action: Action | str, by: str, run_id: str | None = None,
           tool: str | None = None, reason: str | None = None, detail: Any = None,
           outcome: str | None = None) -> int:
    """One audit row; its id (an alert names it). A `detail` that is not text is stored as JSON."""
    if detail is not None and not isinstance(detail, str):
        detail = json.dumps(detail, sort_keys=True, default=str)
    res = conn.execute(insert(interventions).values(
        at=at, action=Action(action), run_id=run_id, tool=tool, reason=reason, detail=detail, outcome=outcome,
        actor=by))
    key = res.inserted_primary_key
    if key is None:  # every backend returns the new id of a one-row insert
        raise RuntimeError("the store returned no id for the audit row")
    return int(key[0])


def stop_intervention(conn: Connection, run_id: str) -> int | None:
    """The stop's audit row someone (the CLI, the daemon) already wrote, if any."""
    iid: int | None = conn.execute(select(interventions.c.id).where(and_(
        interventions.c.run_id == run_id, interventions.c.action == Action.STOP_REQUESTED))
        .order_by(interventions.c.id).limit(1)).scalar()
    return iid


def budget_columns(row: Any) -> tuple[Any, ...]:
    return tuple(getattr(row, k, None) for k in RUN_BUDGET_KEYS)


def seal_grant(conn: Connection, run_id: str, sealer: Sealer) -> bool:
    """After `resume` (the CLI, as root or the daemon's user): seal what it left on the row into
    its `resumed` intervention's outcome. False when the run or the intervention is not there."""
    row = conn.execute(select(*WHOLE_RUN).where(runs.c.id == run_id)).first()
    iv = conn.execute(select(interventions.c.id, interventions.c.outcome).where(and_(
        interventions.c.run_id == run_id, interventions.c.action == Action.RESUMED))
        .order_by(desc(interventions.c.id)).limit(1)).first()
    if row is None or iv is None:
        return False
    mac = sealer.grant(run_id, row.resumes, budget_columns(row))
    outcome = f"{(iv.outcome or '')[:180]}; {GRANT_TAG}{mac}"
    conn.execute(update(interventions).where(interventions.c.id == iv.id).values(outcome=outcome))
    return True


def grant_ok(conn: Connection, row: Any, sealer: Sealer | None) -> bool:
    """The run's budgets are those a sealed operator resume left (its latest one)."""
    if sealer is None or not row.resumes:
        return False
    iv = conn.execute(select(interventions.c.outcome).where(and_(
        interventions.c.run_id == row.id, interventions.c.action == Action.RESUMED))
        .order_by(desc(interventions.c.id)).limit(1)).first()
    m = _GRANT.search(iv.outcome) if iv is not None and isinstance(iv.outcome, str) else None
    return m is not None and sealer.grant_ok(m.group(1), row.id, row.resumes, budget_columns(row))


def attested_uid(conn: Connection, run_id: str, sealer: Sealer | None) -> int | None:
    """The Unix user of a run's attested process (its sealed attestation), else None."""
    if sealer is None:
        return None
    a = conn.execute(select(attestations).where(attestations.c.run_id == run_id)).first()
    if a is None or not sealer.identity_ok(a.mac, a.run_id, a.host, a.pid, a.pid_create_time, a.uid, a.kill_mode):
        return None
    return int(a.uid)


# -- The reads the quarantine of malformed rows makes before it records one (its writes are an -----------

def recorded(conn: Connection, run_id: str, *, action: str, reason: str) -> bool:
    """The run has an intervention of this action and reason (a quarantine recorded before)."""
    return conn.execute(select(interventions.c.id).where(
        interventions.c.run_id == run_id, interventions.c.action == action,
        interventions.c.reason == reason).limit(1)).first() is not None


def run_exists(conn: Connection, run_id: str) -> bool:
    """A row of `runs` has this id (the foreign keys accept no other)."""
    return conn.execute(select(runs.c.id).where(runs.c.id == run_id)).first() is not None


# -- The alerts a daemon queues (`alerts` by dedupe key) and the one verb that announces an outcome ----------------

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
    is stored is what goes out (watchdog.core.outcomes)."""
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
