"""What the append-only events of ended runs show they spent: the ledger books the larger of it and the row.

A run can zero its own `cost_eur` (or steps, tokens) before it ends; its events stay. Read
once per run when it is booked, with DESIGN.md's "one call, one count": per run, the largest
total of any one witness (source; NULL = the run's own writer), or the sum over distinct call
ids (each at the largest amount a witness gave it) when that is larger; never the sum of witnesses.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import Any, NamedTuple

from sqlalchemy import Float, and_, case, cast, func, or_, select
from sqlalchemy.engine import Connection
from sqlalchemy.sql.elements import ColumnElement

from watchdog.core import lifecycle as lc
from watchdog.store.schema import events

CHUNK = 500


class EventTotals(NamedTuple):
    """What one run's events show: the counters the ledger books at least."""

    steps: int
    tool_calls: int
    tool_errors: int
    tokens: int
    cost_eur: float


def _num(col: ColumnElement[Any]) -> ColumnElement[float]:
    """A hand-written bad amount (negative, text) counts as 0 (SQLite adds text as 0 anyway)."""
    return case((col >= 0, cast(col, Float)), else_=0.0)


def event_totals(conn: Connection, run_ids: Sequence[str]) -> dict[str, EventTotals]:
    """run id -> (steps, tool_calls, tool_errors, tokens, cost_eur) its events show."""
    out: dict[str, list[float]] = defaultdict(lambda: [0, 0, 0, 0, 0.0])
    step = case((events.c.kind == lc.EV_STEP, 1), else_=0)
    tool = case((events.c.kind == lc.EV_TOOL, 1), else_=0)
    err = case((and_(events.c.kind == lc.EV_TOOL, events.c.ok.is_(False)), 1), else_=0)
    tokens = _num(func.coalesce(events.c.tokens_in, 0)) + _num(func.coalesce(events.c.tokens_out, 0))
    cost = _num(func.coalesce(events.c.cost_eur, 0.0))
    kinds = events.c.kind.in_((lc.EV_STEP, lc.EV_TOOL))
    for i in range(0, len(run_ids), CHUNK):
        part = run_ids[i : i + CHUNK]
        per_source = (select(events.c.run_id, func.sum(step), func.sum(tool), func.sum(err), func.sum(tokens),
                             func.sum(cost))
                      .where(and_(events.c.run_id.in_(part), kinds)).group_by(events.c.run_id, events.c.source))
        for rid, *vals in conn.execute(per_source):
            acc = out[rid]
            for j, v in enumerate(vals):
                acc[j] = max(acc[j], float(v or 0) if j == 4 else int(v or 0))
        calls = (select(events.c.run_id.label("rid"), func.max(step).label("s"), func.max(tool).label("t"),
                        func.max(err).label("e"), func.max(tokens).label("k"), func.max(cost).label("c"))
                 .where(and_(events.c.run_id.in_(part), kinds, events.c.call_id.is_not(None)))
                 .group_by(events.c.run_id, events.c.kind, events.c.call_id).subquery())
        by_id = select(calls.c.rid, func.sum(calls.c.s), func.sum(calls.c.t), func.sum(calls.c.e),
                       func.sum(calls.c.k), func.sum(calls.c.c)).group_by(calls.c.rid)
        for rid, *vals in conn.execute(by_id):
            acc = out[rid]
            for j, v in enumerate(vals):
                acc[j] = max(acc[j], float(v or 0) if j == 4 else int(v or 0))
    return {rid: EventTotals(int(v[0]), int(v[1]), int(v[2]), int(v[3]), v[4]) for rid, v in out.items()}


class OwnEvents(NamedTuple):
    """What a run's events not marked with any of `excluded` sources show (watchdog.daemon.trust.owned)."""

    totals: EventTotals
    top_signature: tuple[str, int] | None  # the most repeated (tool, args hash) and its count
    calls_since: int  # tool calls at or after `since`


def own_events(conn: Connection, run_id: str, excluded: Sequence[str], since: Any) -> OwnEvents:
    """One run's events but those of the `excluded` sources (a gateway's): per witness, the larger
    total (as event_totals), the top signature, the recent tool calls. Read only before a first
    signal on PostgreSQL: an aggregate over one run's events (indexed by run id)."""
    mine = and_(events.c.run_id == run_id, or_(events.c.source.is_(None), events.c.source.not_in(list(excluded))))
    step = case((events.c.kind == lc.EV_STEP, 1), else_=0)
    tool = case((events.c.kind == lc.EV_TOOL, 1), else_=0)
    err = case((and_(events.c.kind == lc.EV_TOOL, events.c.ok.is_(False)), 1), else_=0)
    recent = case((and_(events.c.kind == lc.EV_TOOL, events.c.at >= since), 1), else_=0)
    tokens = _num(func.coalesce(events.c.tokens_in, 0)) + _num(func.coalesce(events.c.tokens_out, 0))
    cost = _num(func.coalesce(events.c.cost_eur, 0.0))
    acc = [0, 0, 0, 0, 0.0, 0]
    q = (select(func.sum(step), func.sum(tool), func.sum(err), func.sum(tokens), func.sum(cost), func.sum(recent))
         .where(and_(mine, events.c.kind.in_((lc.EV_STEP, lc.EV_TOOL)))).group_by(events.c.source))
    for vals in conn.execute(q):
        for j, v in enumerate(vals):
            acc[j] = max(acc[j], float(v or 0) if j == 4 else int(v or 0))
    n = func.count().label("n")
    top = conn.execute(select(events.c.tool, n).where(and_(mine, events.c.kind == lc.EV_TOOL))
                       .group_by(events.c.source, events.c.tool, events.c.args_hash)
                       .order_by(n.desc()).limit(1)).first()
    return OwnEvents(EventTotals(int(acc[0]), int(acc[1]), int(acc[2]), int(acc[3]), float(acc[4])),
                     (str(top[0]), int(top[1])) if top is not None else None, int(acc[5]))
