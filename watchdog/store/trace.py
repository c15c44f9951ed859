"""A run as a JSONL trace: one JSON object per line, in the vocabulary of a harness trace.

    run_started · model_call · tool_call · heartbeat · stop_requested · signal · paused · resumed · run_ended

Every line carries `run_id` and `parent_id`, `at` (ISO 8601 UTC) and `event`. A run's
lines are in time order (its records by sequence number, the interventions merged in
by time); its child runs follow it, each with its own lines, depth first. Raw tool
arguments never appear: `args_hash` does.
"""

from __future__ import annotations

import datetime as dt
from typing import Any, Iterator

from sqlalchemy import select
from sqlalchemy.engine import Connection

from watchdog.core.interventions import STOP_ACTIONS
from watchdog.core import budgets as bud
from watchdog.core import lifecycle as lc
from watchdog.store.run_rows import MAX_DEPTH, children_of
from watchdog.store.schema import events, interventions, runs, WHOLE_RUN

_SIGNALS = {"sigterm": "SIGTERM", "sigkill": "SIGKILL", "signal_refused": None, "not_signalled": None,
            "stop_failed": "SIGKILL"}
_STOPS = STOP_ACTIONS  # the run asked to stop: by the daemon, the CLI or its own guard


def _iso(value: dt.datetime | None) -> str | None:
    return value.astimezone(dt.timezone.utc).isoformat() if value else None


Line = dict[str, Any]


def _sort_key(at: dt.datetime | None) -> dt.datetime:
    return at or dt.datetime.min.replace(tzinfo=dt.timezone.utc)


def run_lines(conn: Connection, run_id: str, *, children: bool = True) -> Iterator[Line]:
    """The trace of one run (and, with `children`, of its child runs after it)."""
    row = conn.execute(select(*WHOLE_RUN).where(runs.c.id == run_id)).first()
    if row is None:
        return
    yield from _tree(conn, row, children, seen=set(), depth=0)


def _tree(conn: Connection, row: Any, children: bool, seen: set[str], depth: int) -> Iterator[Line]:
    seen.add(row.id)
    yield from _one(conn, row)
    if not children or depth >= MAX_DEPTH:
        return
    for child in children_of(conn, row.id):
        if child.id not in seen:  # a parent_id cycle written by hand is cut
            yield from _tree(conn, child, children, seen, depth + 1)


def _one(conn: Connection, row: Any) -> Iterator[Line]:
    base = {"run_id": row.id, "parent_id": row.parent_id}
    yield {**base, "at": _iso(row.started_at), "event": "run_started", "agent": row.agent,
           "kill_mode": row.kill_mode, "host": row.host, "pid": row.pid, "labels": row.labels,
           "budgets": {k: getattr(row, k) for k in bud.RUN_BUDGET_KEYS if getattr(row, k) is not None}}
    ivs = conn.execute(select(interventions).where(interventions.c.run_id == row.id)
                       .order_by(interventions.c.at, interventions.c.id)).all()
    pending = [(i.at, line) for i in ivs if (line := _intervention(base, i)) is not None]
    k = 0
    q = select(events).where(events.c.run_id == row.id).order_by(events.c.seq)
    for e in conn.execute(q):
        while k < len(pending) and _sort_key(pending[k][0]) < _sort_key(e.at):
            yield pending[k][1]
            k += 1
        yield _event(base, e)
    for _at, line in pending[k:]:
        yield line
    if row.status in lc.END_STATUSES:
        yield {**base, "at": _iso(row.ended_at), "event": "run_ended", "status": row.status,
               "reason": row.stop_reason, "detail": row.stop_detail, "steps": row.steps,
               "tool_calls": row.tool_calls, "cost_eur": round(row.cost_eur, 6), "partial": row.partial}


def _event(base: Line, e: Any) -> Line:
    line = {**base, "at": _iso(e.at), "seq": e.seq}
    if e.kind == lc.EV_STEP:
        return {**line, "event": "model_call", "model": e.model, "tokens_in": e.tokens_in,
                "tokens_out": e.tokens_out, "cost_eur": e.cost_eur}
    if e.kind == lc.EV_TOOL:
        return {**line, "event": "tool_call", "tool": e.tool, "args_hash": e.args_hash, "ok": e.ok,
                "error_class": e.error_class, "duration_s": e.duration_s, "attempt": e.attempt or 1}
    if e.tool is not None:  # a failed result of a call counted before it ran (agent-watchdog hook)
        return {**line, "event": "heartbeat", "progress": e.progress, "tool": e.tool, "ok": e.ok}
    return {**line, "event": "heartbeat", "progress": e.progress}


def _intervention(base: Line, i: Any) -> Line | None:
    line = {**base, "at": _iso(i.at), "by": i.actor}
    if i.action in _STOPS:
        return {**line, "event": "stop_requested", "reason": i.reason, "detail": i.detail, "outcome": i.outcome}
    if i.action in _SIGNALS:
        return {**line, "event": "signal", "signal": _SIGNALS[i.action], "action": i.action, "reason": i.reason,
                "outcome": i.outcome}
    if i.action == "paused":
        return {**line, "event": "paused", "reason": i.reason, "detail": i.detail, "outcome": i.outcome}
    if i.action == "resumed":
        return {**line, "event": "resumed", "reason": i.reason, "granted": i.detail}
    return None  # rate alarms, circuits, the ladder's own bookkeeping: not part of the run's trace
