"""The steps the SDK could not price, as the daemon prices them (watchdog.daemon.money.backfill).

Reads: the unpriced steps of runs not booked yet, with what pricing and the tick's sums need of
their runs, in id order, one statement on the tick's read snapshot. Writes: a step's cost as a
compare-and-set (NULL -> cost: of two daemons one prices it), then the run's cost and its
unpriced tokens. Each write is its own SAVEPOINT: a row written by hand that the store's checks
refuse costs only itself (WriteRefused), the rest of the caller's transaction goes on.
"""

from __future__ import annotations

import datetime as dt
from typing import Any, NamedTuple, Sequence

from sqlalchemy import and_, bindparam, case, select, update
from sqlalchemy.engine import Connection

from watchdog.core import lifecycle as lc
from watchdog.store.engine import store_unavailable
from watchdog.store.isolated import chunk_read
from watchdog.store.scan import IsolatedRead
from watchdog.store.schema import events, runs

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
