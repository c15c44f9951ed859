"""Named verbs for the stops that ended before the daemon saw them as `stopping`.

A run stopped by its in-process guard (or a gateway, or `agent-watchdog kill`) usually ends
milliseconds after its stop request, well inside one tick. The daemon finds those runs
among the runs that ended since its last look (the `ended_at` index) and acknowledges each
once: the unique alert key `stop:<run id>` is the store's record that it did (past the alert
rate that row is written already summarised: recorded, and told in one summary alert).
"""

from __future__ import annotations

import datetime as dt

from sqlalchemy import and_, case, func, insert, or_, select

from watchdog.core import lifecycle as lc
from watchdog.store.schema import alerts, events, interventions, runs

# How many ended runs one look reads at most: the rest are read on the next tick.
BATCH = 2000


def stop_key(run_id: str) -> str:
    return f"stop:{run_id}"[:255]


def ended_since(conn, since: dt.datetime, hosts: frozenset | None, limit: int = BATCH) -> list:
    """Runs that ended at or after `since` with a stop (killed, or a stop was requested before
    they ended), oldest end first; `lost` runs have an alert of their own."""
    q = (select(runs).where(and_(runs.c.ended_at >= since, runs.c.status != lc.LOST,
                                 or_(runs.c.status == lc.KILLED, runs.c.stop_requested_at.is_not(None))))
         .order_by(runs.c.ended_at, runs.c.id).limit(limit))
    if hosts is not None:
        q = q.where(runs.c.host.in_(sorted(hosts)))
    return conn.execute(q).all()


def unheard(conn, run_ids: list[str]) -> set[str]:
    """Of `run_ids`, those whose stop has no alert row (queued, sent or summarised) yet."""
    if not run_ids:
        return set()
    keys = {stop_key(r): r for r in run_ids}
    alerted = {k for (k,) in conn.execute(select(alerts.c.dedupe_key).where(alerts.c.dedupe_key.in_(list(keys))))}
    return {r for k, r in keys.items() if k not in alerted}


def summarised(conn, run_id: str, title: str, body: str, *, now: dt.datetime, intervention_id: int | None,
               sealer, summary_key: str) -> None:
    """The run's own stop alert row, written as already told through the summary `summary_key`:
    the outbox never sends it, `alerts --all` shows it, and it marks the stop as heard."""
    from watchdog.core.alert_text import alert_body, alert_title

    key, title, body = stop_key(run_id), alert_title(title), alert_body(body)
    conn.execute(insert(alerts).values(
        dedupe_key=key, title=title, body=body, created_at=now, run_id=run_id, intervention_id=intervention_id,
        attempts=0, next_attempt_at=None, delivered_targets=[], delivered_at=now,
        last_error=f"summarised in {summary_key}"[:200], sealed_by=sealer.host, mac=sealer.alert(key, title, body, now)))


def stop_intervention(conn, run_id: str) -> int | None:
    """The stop's audit row someone (the CLI, the daemon) already wrote, if any."""
    return conn.execute(select(interventions.c.id).where(and_(
        interventions.c.run_id == run_id, interventions.c.action == "stop_requested"))
        .order_by(interventions.c.id).limit(1)).scalar()


def top_tool(conn, run_id: str) -> tuple[str, int, int] | None:
    """The run's most called tool from its append-only events: (name, calls, errors)."""
    errors = func.sum(case((events.c.ok.is_(False), 1), else_=0))
    row = conn.execute(
        select(events.c.tool, func.count().label("calls"), errors.label("errors"))
        .where(and_(events.c.run_id == run_id, events.c.kind == "tool", events.c.tool.is_not(None)))
        .group_by(events.c.tool).order_by(func.count().desc(), events.c.tool).limit(1)).first()
    if row is None or not isinstance(row.tool, str):
        return None
    return row.tool, int(row.calls or 0), int(row.errors or 0)
