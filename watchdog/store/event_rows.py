"""What a run's append-only events show: their totals for the ledger, and the steps the daemon prices.

What the append-only events of ended runs show they spent: the ledger books the larger of it and the row.

A run can zero its own `cost_eur` (or steps, tokens) before it ends; its events stay. Read
once per run when it is booked, with DESIGN.md's "one call, one count": per run, the largest
total of any one witness (source; NULL = the run's own writer), or the sum over distinct call
ids (each at the largest amount a witness gave it) when that is larger; never the sum of witnesses.

The steps the SDK could not price, as the daemon prices them (watchdog.daemon.money.moneytick).

Reads: the unpriced steps of runs not booked yet, with what pricing and the tick's sums need of
their runs, in id order, one statement on the tick's read snapshot. Writes: a step's cost as a
compare-and-set (NULL -> cost: of two daemons one prices it), then the run's cost and its
unpriced tokens. Each write is its own SAVEPOINT: a row written by hand that the store's checks
refuse costs only itself (WriteRefused), the rest of the caller's transaction goes on.
"""

from __future__ import annotations

import datetime as dt
from collections import defaultdict
from collections.abc import Sequence
from typing import Any, NamedTuple

from sqlalchemy import Float, and_, case, cast, func, or_, select, bindparam, update
from sqlalchemy.engine import Connection
from sqlalchemy.sql.elements import ColumnElement

from watchdog.core import lifecycle as lc
from watchdog.store.engine import store_unavailable
from watchdog.store.scan import chunk_read, IsolatedRead
from watchdog.store.schema import events, runs


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


# -- The steps the SDK could not price, as the daemon prices them (watchdog.daemon.money.moneytick) ------

MAX_PER_TICK = 20_000  # unpriced steps one read returns at most (a backlog drains over ticks)


class UnpricedStep(NamedTuple):
    """An unpriced step and its run, values as stored."""

    id: int
    run_id: str
    at: dt.datetime
    model: str | None
    tokens_in: int | None
    tokens_out: int | None
    cached_tokens_in: int | None
    reasoning_tokens: int | None
    agent: str
    status: str
    labels: Any
    ended_at: dt.datetime | None
    last_seen_at: dt.datetime  # runs.last_seen_at is NOT NULL


class WriteRefused(Exception):
    """The store's checks refused one row's write (a row written by hand): only it is skipped."""


_COLS = (events.c.id, events.c.run_id, events.c.at, events.c.model, events.c.tokens_in, events.c.tokens_out,
         events.c.cached_tokens_in, events.c.reasoning_tokens, runs.c.agent, runs.c.status, runs.c.labels,
         runs.c.ended_at, runs.c.last_seen_at)
_JOINED = events.join(runs, runs.c.id == events.c.run_id)
_QUERIES: dict[tuple[bool, bool, bool, bool], Any] = {}


def _unpriced_query(whole: bool, by_runs: bool, by_id: bool, by_ids: bool) -> Any:
    """The unpriced steps' read (whole rows or only ids; of `run_ids`, above an id, and/or of
    `event_ids`), built once per shape with bound parameters: the tick runs it whenever a step
    was written, and building it anew cost more than the database's work."""
    key = (whole, by_runs, by_id, by_ids)
    q = _QUERIES.get(key)
    if q is None:
        conds: list[Any] = [events.c.kind == lc.EV_STEP, events.c.cost_eur.is_(None), runs.c.booked_at.is_(None)]
        if by_runs:
            conds.append(events.c.run_id.in_(bindparam("run_ids", expanding=True)))
        if by_id:
            conds.append(events.c.id > bindparam("above", type_=events.c.id.type))
        if by_ids:
            conds.append(events.c.id.in_(bindparam("event_ids", expanding=True)))
        q = _QUERIES[key] = (select(*(_COLS if whole else (events.c.id,))).select_from(_JOINED).where(and_(*conds))
                             .order_by(events.c.id).limit(MAX_PER_TICK))
    return q


def unpriced_steps(conn: Connection, *, run_ids: Sequence[str] | None = None, above: int | None = None,
                   event_ids: Sequence[int] | None = None, isolated: IsolatedRead, defects: list[Any],
                   suspects: dict[Any, Any]) -> list[UnpricedStep]:
    """The unpriced steps of runs not booked yet, of `run_ids`, with an id above `above` and/or
    among `event_ids`, in id order, at most MAX_PER_TICK. One step that cannot be read (a
    timestamp that does not parse, of a step or of its run) costs only itself: it becomes a defect."""
    params: dict[str, Any] = {}
    if run_ids is not None:
        params["run_ids"] = list(run_ids)
    if above is not None:
        params["above"] = above
    if event_ids is not None:
        params["event_ids"] = list(event_ids)
    shape = (run_ids is not None, above is not None, event_ids is not None)
    try:
        with chunk_read(conn):
            rows = conn.execute(_unpriced_query(True, *shape), params).all()
    except Exception as exc:  # noqa: BLE001
        if store_unavailable(exc):
            raise
    else:
        return [UnpricedStep(*r) for r in rows]
    ids = list(conn.execute(_unpriced_query(False, *shape), params).scalars())
    found = isolated(conn, lambda part: select(*_COLS).select_from(_JOINED).where(events.c.id.in_(part)), ids,
                     table=events, key_col=events.c.id, defects=defects, suspects=suspects, event=True)
    return sorted((UnpricedStep(*r) for r in found), key=lambda r: r.id)


def unbooked_unpriced_runs(conn: Connection) -> list[str]:
    """The runs not booked yet that hold unpriced tokens (a cold start reads their steps)."""
    return list(conn.execute(select(runs.c.id).where(and_(
        runs.c.status.in_(lc.STATUSES), runs.c.booked_at.is_(None), runs.c.cost_unpriced_tokens > 0))).scalars())


def _guarded(conn: Connection, stmt: Any) -> Any:
    try:
        with conn.begin_nested():
            return conn.execute(stmt)
    except Exception as exc:  # noqa: BLE001
        if store_unavailable(exc):
            raise
        raise WriteRefused(str(type(exc).__name__)) from exc


def hold_run_row(conn: Connection, run_id: str) -> bool:
    """Lock the run's row for the rest of the transaction, or False if another session holds it
    (PostgreSQL: SKIP LOCKED): an agent that holds its own run row locked and idles must not
    stall the leader's pricing (a review finding); that run's steps stay unpriced, priced a later
    tick. SQLite has no row locks (its writers take the whole file): always True."""
    if conn.dialect.name != "postgresql":
        return True
    q = select(runs.c.id).where(runs.c.id == run_id).with_for_update(skip_locked=True)
    return conn.execute(q).first() is not None


def price_step(conn: Connection, event_id: int, cost_eur: float) -> bool:
    """Set the step's cost if it is still unpriced; False: another daemon priced it first.
    WriteRefused: the store's checks refused the row."""
    res = _guarded(conn, update(events).where(and_(events.c.id == event_id, events.c.cost_eur.is_(None)))
                   .values(cost_eur=cost_eur))
    return bool(res.rowcount == 1)


def add_run_cost(conn: Connection, run_id: str, cost_eur: float, tokens: int) -> None:
    """Move priced steps' cost onto their run: its cost grows, its unpriced tokens shrink (never
    below 0). WriteRefused: the store's checks refused the row (a counter written by hand)."""
    left = runs.c.cost_unpriced_tokens
    _guarded(conn, update(runs).where(runs.c.id == run_id).values(
        cost_eur=runs.c.cost_eur + cost_eur, cost_unpriced_tokens=case((left > tokens, left - tokens), else_=0)))
