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
from watchdog.core.alert_text import alert_body, alert_title
from watchdog.core.budgets import Budgets
from watchdog.core.text import one_line
from watchdog.core.messages import RunFacts
from watchdog.core.scrub import scrub
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
                  intervention_id=None, sealer=None) -> bool:
    """Put an alert in the outbox once per key, ever; False if that key was already queued.

    Sealed with the daemon's key (`sealer`): the outbox delivers nothing it cannot verify,
    so only a daemon composes what reaches a human. Without a sealer (a caller that is not
    the daemon) nothing is queued. Title and body are bounded before they are sealed: what
    is stored is what goes out (watchdog.core.alert_text)."""
    if sealer is None:
        return False
    key, title, body = key[:255], alert_title(title), alert_body(body)
    if queued(conn, key):
        return False
    conn.execute(insert(alerts).values(
        dedupe_key=key, title=title, body=body, created_at=now, run_id=run_id,
        intervention_id=intervention_id, attempts=0, next_attempt_at=now, delivered_targets=[],
        sealed_by=sealer.host, mac=sealer.alert(key, title, body, now)))
    return True


def facts(row, top_tool=None, last_error=None, now: dt.datetime | None = None) -> RunFacts:
    """What an alert may say about a run; its free texts (an error, a heartbeat) are agents'
    words: scrubbed again here (an agent in another language may have stored them raw)."""
    end = row.ended_at or now or row.last_seen_at
    if top_tool is not None:
        top_tool = (one_line(scrub(str(top_tool[0])) or "", 64), *top_tool[1:])
    # Each store text on one printable line: a newline in an agent's name must not let its
    # writer add a line of their own ("action: nothing was done") to the on-call's alert.
    return RunFacts(
        id=one_line(row.id, 40), agent=one_line(scrub(str(row.agent)) or "", 64), host=one_line(row.host, 100), pid=row.pid,
        kill_mode=one_line(row.kill_mode, 16), steps=row.steps,
        tool_calls=row.tool_calls, tool_errors=row.tool_errors, cost_eur=row.cost_eur,
        duration_s=max(0.0, (end - row.started_at).total_seconds()), top_tool=top_tool,
        last_error=_line(scrub(last_error), 300), progress=_line(scrub(row.progress), 300),
        tokens=(row.tokens_in or 0) + (row.tokens_out or 0),
        unpriced_tokens=getattr(row, "cost_unpriced_tokens", 0) or 0,
        partial=_line(scrub(getattr(row, "partial", None)), 500))


def _line(text: str | None, limit: int) -> str | None:
    return None if text is None else one_line(text, limit)


# A run seen only through spans whose sender the kernel did not confirm (watchdog.daemon.otlp).
SPANS_UNPROVEN = "not signalled: spans cannot prove their sender"


def stop_plan(kill_mode: str, source: str | None = None) -> str:
    if kill_mode == lc.COOPERATIVE and source == lc.Source.OTLP:
        return f"cooperative stop requested ({SPANS_UNPROVEN})"
    if kill_mode == lc.COOPERATIVE:
        return "cooperative stop requested (the run shares its process: it will not be signalled)"
    return "cooperative stop requested; SIGTERM after the cancel grace if it has not ended"


def request_stop(conn, row, *, reason: str, detail: str, now: dt.datetime, by: str, budgets: Budgets,
                 run_facts: RunFacts, sealer=None, why: str | None = None, own_parent=None) -> bool:
    """running (or paused) → stopping, with its intervention and (from the daemon, `sealer` given)
    its alert, and the same for the run's active child runs; False if someone else got there
    first. Without a sealer (the CLI) the daemon composes the alerts when it sees the stops.
    `why`: said before the plan (a paused run nobody answered, or killed while paused)."""
    from watchdog.core.messages import stop_alert
    from watchdog.store.children import lock_family, stop_descendants, with_top_child

    lock_family(conn, row.id)  # in the agents' lock order: descendants first, then this run
    res = conn.execute(
        update(runs)
        .where(and_(runs.c.id == row.id, runs.c.status.in_(lc.STOPPABLE_STATUSES)))
        .values(status=lc.STOPPING, stop_reason=reason, stop_detail=detail, stop_requested_at=now)
    )
    if res.rowcount != 1:
        return False
    plan = stop_plan(row.kill_mode, getattr(row, "source", None))
    iid = record(conn, at=now, action="stop_requested", by=by, run_id=row.id, reason=reason, detail=detail,
                 outcome=f"{why}; {plan}" if why else plan)
    if sealer is not None:
        title, body = stop_alert(with_top_child(conn, row, run_facts), budgets, reason, detail,
                                 f"{why}; {plan}" if why else plan)
        enqueue_alert(conn, f"stop:{row.id}", title, body, now=now, run_id=row.id, intervention_id=iid,
                      sealer=sealer)
    for child, child_detail in stop_descendants(conn, row, reason=reason, detail=detail, now=now, by=by):
        if sealer is not None and own_parent is not None and not own_parent(child):
            # issue 20: the link to this parent is not the daemon's own record (any writer can set
            # parent_id): a cooperative stop, alerted as a stop the daemon did not decide.
            from watchdog.core.messages import requested_stop_alert

            title, body = requested_stop_alert(
                facts(child, now=now), budgets_of_child(child, budgets), reason,
                "cooperative stop requested with the run it names as its parent; that link is not the "
                "daemon's own record, so this run is never signalled for it")
            enqueue_alert(conn, f"stop:{child.id}", title, body, now=now, run_id=child.id, sealer=sealer)
            continue
        if sealer is not None:
            title, body = stop_alert(facts(child, now=now), budgets_of_child(child, budgets), reason, child_detail,
                                     stop_plan(child.kill_mode))
            enqueue_alert(conn, f"stop:{child.id}", title, body, now=now, run_id=child.id, sealer=sealer)
    return True


def budgets_of_child(child, parent_budgets: Budgets) -> Budgets:
    """What a child run's alert shows it against: its own columns over its parent's profile
    (the daemon's config is not at hand here; a child never has more than its parent)."""
    from watchdog.core.budgets import for_run

    return for_run(parent_budgets, child)


def mark_lost(conn, row, *, detail: str, now: dt.datetime, by: str, budgets: Budgets, run_facts: RunFacts,
              sealer=None) -> bool:
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
    enqueue_alert(conn, f"lost:{row.id}", title, body, now=now, run_id=row.id, intervention_id=iid, sealer=sealer)
    return True
