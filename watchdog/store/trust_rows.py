"""The store verbs of the daemon's evidence rules (issue 20): sealed grants, attested owners,
and stops of rows the daemon cannot read whole.

Nothing here trusts a row on its word: a grant counts only with the daemon's seal, an owner
only from a sealed attestation (or PostgreSQL's own `runs.owner`, set by the database).
"""

from __future__ import annotations

import datetime as dt
import re

from sqlalchemy import and_, desc, select, update

from watchdog.core import lifecycle as lc
from watchdog.core.budgets import RUN_BUDGET_KEYS
from watchdog.store.actions import enqueue_alert, queued, record
from watchdog.store.schema import attestations, interventions, runs

GRANT_TAG = "sealed grant/1 "
_GRANT = re.compile(r"sealed grant/1 ([0-9a-f]{64})")


def budget_columns(row) -> tuple:
    return tuple(getattr(row, k, None) for k in RUN_BUDGET_KEYS)


def seal_grant(conn, run_id: str, sealer) -> bool:
    """After `resume` (the CLI, as root or the daemon's user): seal what it left on the row into
    its `resumed` intervention's outcome. False when the run or the intervention is not there."""
    row = conn.execute(select(runs).where(runs.c.id == run_id)).first()
    iv = conn.execute(select(interventions.c.id, interventions.c.outcome).where(and_(
        interventions.c.run_id == run_id, interventions.c.action == "resumed"))
        .order_by(desc(interventions.c.id)).limit(1)).first()
    if row is None or iv is None:
        return False
    mac = sealer.grant(run_id, row.resumes, budget_columns(row))
    outcome = f"{(iv.outcome or '')[:180]}; {GRANT_TAG}{mac}"
    conn.execute(update(interventions).where(interventions.c.id == iv.id).values(outcome=outcome))
    return True


def grant_ok(conn, row, sealer) -> bool:
    """The run's budgets are those a sealed operator resume left (its latest one)."""
    if sealer is None or not row.resumes:
        return False
    iv = conn.execute(select(interventions.c.outcome).where(and_(
        interventions.c.run_id == row.id, interventions.c.action == "resumed"))
        .order_by(desc(interventions.c.id)).limit(1)).first()
    m = _GRANT.search(iv.outcome) if iv is not None and isinstance(iv.outcome, str) else None
    return bool(m) and sealer.grant_ok(m.group(1), row.id, row.resumes, budget_columns(row))


def attested_uid(conn, run_id: str, sealer) -> int | None:
    """The Unix user of a run's attested process (its sealed attestation), else None."""
    if sealer is None:
        return None
    a = conn.execute(select(attestations).where(attestations.c.run_id == run_id)).first()
    if a is None or not sealer.identity_ok(a.mac, a.run_id, a.host, a.pid, a.pid_create_time, a.uid, a.kill_mode):
        return None
    return a.uid


def stop_unreadable(conn, run_id: str, *, reason: str, detail: str, outcome: str, now: dt.datetime, by: str,
                    title: str, body: str, sealer=None) -> bool:
    """running / paused -> stopping for a run whose row the daemon cannot read whole (it never
    builds a row object): its intervention and alert, worded by the daemon. False if it was not active."""
    res = conn.execute(update(runs).where(and_(runs.c.id == run_id, runs.c.status.in_(lc.STOPPABLE_STATUSES)))
                       .values(status=lc.STOPPING, stop_reason=reason, stop_detail=detail, stop_requested_at=now))
    if res.rowcount != 1:
        return False
    iid = record(conn, at=now, action="stop_requested", by=by, run_id=run_id, reason=reason, detail=detail,
                 outcome=outcome)
    enqueue_alert(conn, f"stop:{run_id}", title, body, now=now, run_id=run_id, intervention_id=iid, sealer=sealer)
    return True


def end_unreadable(conn, run_id: str, *, now: dt.datetime, by: str, title: str, body: str, sealer=None) -> bool:
    """An active run the daemon cannot read whole whose process is gone: lost."""
    res = conn.execute(update(runs).where(and_(runs.c.id == run_id, runs.c.status.in_(lc.ACTIVE_STATUSES)))
                       .values(status=lc.LOST, stop_reason=lc.PROCESS_GONE, stop_detail="its process is gone",
                               ended_at=now))
    if res.rowcount != 1:
        return False
    iid = record(conn, at=now, action="lost", by=by, run_id=run_id, reason=lc.PROCESS_GONE,
                 detail="its process is gone", outcome="marked lost (its row could not be read whole)")
    enqueue_alert(conn, f"lost:{run_id}", title, body, now=now, run_id=run_id, intervention_id=iid, sealer=sealer)
    return True


def restore_stage(conn, run_id: str, stage, signalled_at) -> None:
    """Put the ladder's stage back to what the daemon recorded (a writer set another one)."""
    conn.execute(update(runs).where(and_(runs.c.id == run_id, runs.c.status == lc.STOPPING))
                 .values(signal_stage=stage, signalled_at=signalled_at))


def stage_of(conn, run_id: str):
    """(signal_stage, signalled_at) as the caller's own transaction just left them."""
    return conn.execute(select(runs.c.signal_stage, runs.c.signalled_at).where(runs.c.id == run_id)).first()


def run_row(conn, run_id: str):
    return conn.execute(select(runs).where(runs.c.id == run_id)).first()


def deny_pause(conn, row, *, now: dt.datetime, by: str, title: str, body: str, sealer=None):
    """paused -> running for a pause the daemon neither wrote nor confirms (a store writer's
    claim): recorded, alerted once per run in the daemon's words; the row read again (or None)."""
    res = conn.execute(update(runs).where(and_(runs.c.id == row.id, runs.c.status == lc.PAUSED))
                       .values(status=lc.RUNNING, paused_at=None, stop_reason=None, stop_detail=None))
    if res.rowcount != 1:
        return None
    key = f"pause-denied:{row.id}"
    if not queued(conn, key):
        iid = record(conn, at=now, action="pause_denied", by=by, run_id=row.id,
                     outcome="paused in the store, not confirmed by the daemon's counters: running again")
        enqueue_alert(conn, key, title, body, now=now, run_id=row.id, intervention_id=iid, sealer=sealer)
    return run_row(conn, row.id)


