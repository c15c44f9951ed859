"""The audit rows (`interventions`): written, believed, and the quarantine's reads of them.

The audit rows (`interventions`): every stop, signal, pause and circuit change is one,
written in the same transaction as the state change it records, so a crash never leaves a
stop without its record. And what the daemon believes of them: a resume counts only with
the daemon's seal, an owner only from a sealed attestation.

The reads the quarantine of malformed rows makes before it records one (its writes are an
intervention and an alert: watchdog.store.interventions, watchdog.store.alerts).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import socket
from typing import Any

from sqlalchemy import and_, desc, insert, select, update
from sqlalchemy.engine import Connection

from watchdog.core.budgets import RUN_BUDGET_KEYS
from watchdog.core.interventions import Action
from watchdog.core.seal import Sealer
from watchdog.store.schema import attestations, interventions, runs, WHOLE_RUN


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
