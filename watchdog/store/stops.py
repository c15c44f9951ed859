"""A run's stop in the store: the request (status, reason, audit row), its children's, a run
lost, and the reads the deciders make about stopped runs.

Each verb does one thing in the caller's transaction; what a stop says to a human (the
alert, sealed) is composed by the daemon (watchdog.daemon.stops.stopping), which calls these.
"""

from __future__ import annotations

import datetime as dt
from typing import Any, NamedTuple

from sqlalchemy import Integer, and_, bindparam, case, func, or_, select, update
from sqlalchemy.engine import Connection, Row

from watchdog.core import lifecycle as lc
from watchdog.core.interventions import Action
from watchdog.core.marked import ident, marked
from watchdog.core.messages import reason_of
from watchdog.store import run_rows
from watchdog.store.engine import bound_lock_waits
from watchdog.store.run_rows import descendants, lock_family
from watchdog.store.interventions import record
from watchdog.store.rows import RunRow
from watchdog.store.schema import events, runs, WHOLE_RUN

# How many ended runs one look reads at most: the rest are read on the next tick.
BATCH = 2000
DETAIL_CHARS = 2000  # runs.stop_detail as a child's stop words it


class ToolCount(NamedTuple):
    """A run's most called tool: its name, calls and failed calls."""

    name: str
    calls: int
    errors: int


class Stage(NamedTuple):
    """The stop ladder's place on a run: its stage and when it was signalled."""

    signal_stage: Any
    signalled_at: Any


def request_stop(conn: Connection, run_id: str, *, reason: str, detail: str, outcome: str, now: dt.datetime,
                 by: str) -> int | None:
    """running (or paused) -> stopping, with its `stop_requested` audit row; that row's id, or
    None if the run was not stoppable (someone else got there first, or it ended). Its lock waits
    are bounded (engine.bound_lock_waits): a writer holding the row raises (engine.row_locked)."""
    bound_lock_waits(conn)
    lock_family(conn, run_id)  # in the agents' lock order: descendants first, then this run
    if not run_rows.move(conn, run_id, lc.STOPPING, was=lc.STOPPABLE_STATUSES, stop_reason=reason,
                         stop_detail=detail, stop_requested_at=now):
        return None
    return record(conn, at=now, action=Action.STOP_REQUESTED, by=by, run_id=run_id, reason=reason, detail=detail,
                  outcome=outcome)


def stop_children(conn: Connection, row: Any, *, reason: str, detail: str, now: dt.datetime,
                  by: str) -> list[tuple[RunRow, str]]:
    """The active descendants of a run being stopped go to `stopping` too (each with its audit row),
    with the parent's reason: cooperatively, and through the ladder by signal for a child that owns
    its process. Returns the rows stopped, each with its stop's words (the caller alerts them)."""
    stopped = []
    for child in descendants(conn, row.id):
        if child.status not in lc.STOPPABLE_STATUSES:
            continue
        # The parent's agent name and id are its writer's text: marked (watchdog.core.marked), and
        # the parent's own detail is not repeated (it may quote its writer), only its reason's words.
        why = (f"its parent run {ident(row.id)} ({marked(row.agent)}) was stopped: "
               f"{reason_of(reason)}")[:DETAIL_CHARS]
        if run_rows.move(conn, child.id, lc.STOPPING, was=lc.STOPPABLE_STATUSES, stop_reason=reason,
                         stop_detail=why, stop_requested_at=now):
            record(conn, at=now, action=Action.STOP_REQUESTED, by=by, run_id=child.id, reason=reason, detail=why,
                   outcome="stopped with its parent")
            stopped.append((child, why))
    return stopped


def mark_lost(conn: Connection, run_id: str, *, detail: str, now: dt.datetime, by: str,
              outcome: str = "marked lost") -> int | None:
    """An active run whose process is gone without ending it -> lost, with its audit row; that
    row's id, or None if the run was not active any more. Lock waits bounded as request_stop's."""
    bound_lock_waits(conn)
    if not run_rows.move(conn, run_id, lc.LOST, was=lc.ACTIVE_STATUSES, stop_reason=lc.PROCESS_GONE,
                         stop_detail=detail, ended_at=now):
        return None
    return record(conn, at=now, action=Action.LOST, by=by, run_id=run_id, reason=lc.PROCESS_GONE, detail=detail,
                  outcome=outcome)


def ended_since(conn: Connection, since: dt.datetime, hosts: frozenset[str] | None,
                limit: int = BATCH) -> list[Row[Any]]:
    """Runs that ended at or after `since` with a stop (killed, or a stop was requested before
    they ended), oldest end first; `lost` runs have an alert of their own."""
    params: dict[str, Any] = {"b_since": since, "b_limit": limit}
    if hosts is not None:
        params["b_hosts"] = sorted(hosts)
    return list(conn.execute(_ended_statement(hosts is not None), params).all())


_ENDED: dict[bool, Any] = {}


def _ended_statement(on_hosts: bool) -> Any:
    """ended_since's SELECT, built once per shape (every tick runs it)."""
    q = _ENDED.get(on_hosts)
    if q is None:
        cond = and_(runs.c.ended_at >= bindparam("b_since", type_=runs.c.ended_at.type), runs.c.status != lc.LOST,
                    or_(runs.c.status == lc.KILLED, runs.c.stop_requested_at.is_not(None)))
        if on_hosts:
            cond = and_(cond, runs.c.host.in_(bindparam("b_hosts", expanding=True)))
        q = _ENDED[on_hosts] = (select(*WHOLE_RUN).where(cond).order_by(runs.c.ended_at, runs.c.id)
                                .limit(bindparam("b_limit", type_=Integer())))
    return q


def top_tool(conn: Connection, run_id: str) -> ToolCount | None:
    """The run's most called tool from its append-only events: (name, calls, errors)."""
    errors = func.sum(case((events.c.ok.is_(False), 1), else_=0))
    row = conn.execute(
        select(events.c.tool, func.count().label("calls"), errors.label("errors"))
        .where(and_(events.c.run_id == run_id, events.c.kind == lc.EV_TOOL, events.c.tool.is_not(None)))
        .group_by(events.c.tool).order_by(func.count().desc(), events.c.tool).limit(1)).first()
    if row is None or not isinstance(row.tool, str):
        return None
    return ToolCount(row.tool, int(row.calls or 0), int(row.errors or 0))


def run_row(conn: Connection, run_id: str) -> RunRow | None:
    """The run's whole row as the caller's transaction sees it."""
    row = conn.execute(select(*WHOLE_RUN).where(runs.c.id == run_id)).first()
    return None if row is None else RunRow.from_mapping(row._mapping)


def restore_stage(conn: Connection, run_id: str, stage: Any, signalled_at: Any) -> None:
    """Put the ladder's stage back to what the daemon recorded (a writer set another one)."""
    conn.execute(update(runs).where(and_(runs.c.id == run_id, runs.c.status == lc.STOPPING))
                 .values(signal_stage=stage, signalled_at=signalled_at))


def stage_of(conn: Connection, run_id: str) -> Stage | None:
    """(signal_stage, signalled_at) as the caller's own transaction just left them."""
    r = conn.execute(select(runs.c.signal_stage, runs.c.signalled_at).where(runs.c.id == run_id)).first()
    return None if r is None else Stage(r.signal_stage, r.signalled_at)


def touch(conn: Connection, run_id: str) -> None:
    """Give a run the next change number (the triggers number every UPDATE) without changing a
    value: the tick looks at it at its next pass, not at its once-a-minute read of every run."""
    conn.execute(update(runs).where(runs.c.id == run_id).values(signal_stage=runs.c.signal_stage))
