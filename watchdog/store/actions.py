"""Store-side interventions: every stop, signal and circuit change is an audit row,
written in the same transaction as the state change and its alert, so a crash
can never leave a stop without its record or an alert without its stop.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import socket

from sqlalchemy import and_, insert, select, update

from watchdog.core import lifecycle as lc
from watchdog.core.budgets import Budgets
from watchdog.core.messages import RunFacts
from watchdog.store.schema import alerts, interventions, runs


def actor(kind: str = "daemon") -> str:
    return f"{kind}@{socket.gethostname()}:{os.getpid()}"


def record(conn, *, at: dt.datetime, action: str, by: str, run_id=None, tool=None, reason=None,
           detail=None, outcome=None) -> int:
    if detail is not None and not isinstance(detail, str):
        detail = json.dumps(detail, sort_keys=True, default=str)
    res = conn.execute(insert(interventions).values(
        at=at, action=action, run_id=run_id, tool=tool, reason=reason, detail=detail, outcome=outcome, actor=by))
    return res.inserted_primary_key[0]


def queued(conn, key: str) -> bool:
    """An alert with this dedupe key is (or was) in the outbox."""
    return conn.execute(select(alerts.c.id).where(alerts.c.dedupe_key == key[:255])).first() is not None


def enqueue_alert(conn, key: str, title: str, body: str, *, now: dt.datetime, run_id=None,
                  intervention_id=None) -> bool:
    """Put an alert in the outbox once per key, ever; False if that key was already queued."""
    if queued(conn, key):
        return False
    conn.execute(insert(alerts).values(
        dedupe_key=key[:255], title=title[:500], body=body, created_at=now, run_id=run_id,
        intervention_id=intervention_id, attempts=0, next_attempt_at=now, delivered_targets=[]))
    return True


def facts(row, top_tool=None, last_error=None, now: dt.datetime | None = None) -> RunFacts:
    end = row.ended_at or now or row.last_seen_at
    return RunFacts(
        id=row.id, agent=row.agent, host=row.host, pid=row.pid, kill_mode=row.kill_mode, steps=row.steps,
        tool_calls=row.tool_calls, tool_errors=row.tool_errors, cost_eur=row.cost_eur,
        duration_s=max(0.0, (end - row.started_at).total_seconds()), top_tool=top_tool, last_error=last_error,
        progress=row.progress, tokens=(row.tokens_in or 0) + (row.tokens_out or 0),
        unpriced_tokens=getattr(row, "cost_unpriced_tokens", 0) or 0)


def request_stop(conn, row, *, reason: str, detail: str, now: dt.datetime, by: str, budgets: Budgets,
                 run_facts: RunFacts) -> bool:
    """running → stopping, with its intervention and alert; False if someone else got there first."""
    from watchdog.core.messages import stop_alert

    res = conn.execute(
        update(runs)
        .where(and_(runs.c.id == row.id, runs.c.status == lc.RUNNING))
        .values(status=lc.STOPPING, stop_reason=reason, stop_detail=detail, stop_requested_at=now)
    )
    if res.rowcount != 1:
        return False
    if row.kill_mode == lc.COOPERATIVE:
        plan = "cooperative stop requested (the run shares its process: it will not be signalled)"
    else:
        plan = "cooperative stop requested; SIGTERM after the cancel grace if it has not ended"
    iid = record(conn, at=now, action="stop_requested", by=by, run_id=row.id, reason=reason, detail=detail,
                 outcome=plan)
    title, body = stop_alert(run_facts, budgets, reason, detail, plan)
    enqueue_alert(conn, f"stop:{row.id}", title, body, now=now, run_id=row.id, intervention_id=iid)
    return True


def mark_lost(conn, row, *, detail: str, now: dt.datetime, by: str, budgets: Budgets, run_facts: RunFacts) -> bool:
    from watchdog.core.messages import lost_alert

    res = conn.execute(
        update(runs)
        .where(and_(runs.c.id == row.id, runs.c.status.in_(lc.ACTIVE_STATUSES)))
        .values(status=lc.LOST, stop_reason=lc.PROCESS_GONE, stop_detail=detail, ended_at=now)
    )
    if res.rowcount != 1:
        return False
    iid = record(conn, at=now, action="lost", by=by, run_id=row.id, reason=lc.PROCESS_GONE, detail=detail,
                 outcome="marked lost")
    title, body = lost_alert(run_facts, budgets, detail)
    enqueue_alert(conn, f"lost:{row.id}", title, body, now=now, run_id=row.id, intervention_id=iid)
    return True
