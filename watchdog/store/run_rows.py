"""A run's row: its status moves, the tick's small reads of it, its children, its times after a jump of the
store's clock, and its stop.

A run's row: its status moves, the tick's small reads of it, its children, its times after a jump of the
store's clock.

The writer of `runs.status` for the daemon, the CLI and the gateways (the SDK's pre-rendered
hot statements in agent_writes and lineage make their few fixed moves themselves): every move
is checked against `lifecycle.STATUS_MOVES` before anything is written, and is a compare-and-set on the
status (or statuses) the caller expects, so two writers never make the same move twice.

A move the table does not list raises IllegalStatusMove (a bug in the caller, never a
condition of the data). The transaction is the caller's.

The tick's small reads of one run's rows: its labels, its stop's alert and audit row.

The Ticker and Money speak no SQL (issue 21): these are their statements, named. Each
runs on the caller's connection — inside the tick's read snapshot, or inside the write
transaction that holds SQLite's lock (a second connection would wait for it).

Child runs in the store: a run's descendants, its lock order, the child that spent most.

A child's steps, tool calls and spend are added to its ancestors' rows by the SDK in
the child's own record transaction (watchdog.sdk.obey), so the daemon judges a
parent on its totals without reading its children. What is here runs only when a run
is stopped (watchdog.store.run_rows.stop_children) or shown.

After a jump of the store's clock: the active runs' times moved onto the new clock.

A run that started 10 s before the clock was stepped +1 h is 10 s old, not 3,610 s; after
-1 h, its last_seen_at (kept by GREATEST) would sit an hour in the future and hide its
silence. Only the columns the daemon measures durations from, only active runs (a few
rows, once per jump), each row written only if no record changed it meanwhile; and the
next attempt of the alerts not delivered yet (after -1 h it would wait an hour).

A run's stop in the store: the request (status, reason, audit row), its children's, a run
lost, and the reads the deciders make about stopped runs.

Each verb does one thing in the caller's transaction; what a stop says to a human (the
alert, sealed) is composed by the daemon (watchdog.daemon.stops.stopping), which calls these.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import functools
from collections.abc import Iterator, Sequence, Callable
from typing import Any, Iterable, NamedTuple

from sqlalchemy import and_, update, Text, bindparam, cast, select, desc, literal, Integer, case, func, or_
from sqlalchemy.engine import Connection, Row
from sqlalchemy.sql.elements import ColumnElement

from watchdog.core import lifecycle as lc
from watchdog.core.interventions import Action
from watchdog.core.lifecycle import IllegalStatusMove
from watchdog.core.text import ident, marked
from watchdog.core.messages import RunFacts, reason_of
from watchdog.store.alerts import stop_key, record
from watchdog.store.engine import store_unavailable, bound_lock_waits
from watchdog.store.ledger import parse_labels
from watchdog.store.rows import RunRow
from watchdog.store.schema import runs, alerts, WHOLE_RUN, events


IllegalMove = IllegalStatusMove  # the name callers of this module catch in tests


def move(conn: Connection, run_id: str, to: lc.Status, *, was: lc.Status | Iterable[lc.Status],
         when: ColumnElement[bool] | None = None, **values: Any) -> bool:
    """was -> to for one run, writing `values` with it; False when the run is not (any more)
    in `was` (or `when`, a further condition on its row, does not hold)."""
    froms = (was,) if isinstance(was, str) else tuple(was)
    for current in froms:
        lc.check_status_move(current, to)
    cond = runs.c.status == froms[0] if len(froms) == 1 else runs.c.status.in_(froms)
    if when is not None:
        cond = and_(cond, when)
    res = conn.execute(update(runs).where(and_(runs.c.id == run_id, cond)).values(status=to, **values))
    return bool(res.rowcount == 1)


# -- The tick's small reads of one run's rows: its labels, its stop's alert and audit row ---------------

CHUNK = 500  # ids per IN (...): well under every backend's bound-parameter limit


class RunLabels(NamedTuple):
    run_id: str
    labels: dict[str, Any] | None  # None when the stored value is not a JSON object


class RunOwner(NamedTuple):
    """Who inserted a run (PostgreSQL's login; None on SQLite) and which witness created it."""

    owner: str | None
    source: str | None


class StopAlert(NamedTuple):
    """A run's `stop:<id>` alert as its seal covers it (watchdog.core.seal.Sealer.alert_ok)."""

    dedupe_key: str
    title: Any  # text, or whatever a hand-written row holds: the seal check says
    body: Any
    mac: Any
    created_at: dt.datetime | None


def labels_of(conn: Connection, run_ids: Sequence[str]) -> Iterator[RunLabels]:
    """The labels of these runs, read as text and parsed here: the JSON type would fail the
    whole read on one hand-written value."""
    for i in range(0, len(run_ids), CHUNK):
        for rid, raw in conn.execute(_LABELS, {"ids": list(run_ids[i : i + CHUNK])}):
            yield RunLabels(rid, parse_labels(raw))


# Built once (the money work reads the labels of the runs first seen on every tick that saw one).
_LABELS = select(runs.c.id, cast(runs.c.labels, Text)).where(runs.c.id.in_(bindparam("ids", expanding=True)))


def stop_alert(conn: Connection, run_id: str) -> StopAlert | None:
    """The run's stop alert (`stop:<run id>`), or None when none is queued."""
    a = conn.execute(select(alerts.c.dedupe_key, alerts.c.title, alerts.c.body, alerts.c.mac, alerts.c.created_at)
                     .where(alerts.c.dedupe_key == stop_key(run_id))).first()
    return None if a is None else StopAlert(a.dedupe_key, a.title, a.body, a.mac, a.created_at)


def redrive_alerts(conn: Connection, run_id: str, limit: int = 5) -> list[StopAlert]:
    """The run's `redrive:<id>:<time>` alerts (an operator's `kill` of a run already stopping),
    newest first; the caller verifies each one's seal."""
    rows = conn.execute(select(alerts.c.dedupe_key, alerts.c.title, alerts.c.body, alerts.c.mac, alerts.c.created_at)
                        .where(alerts.c.run_id == run_id, alerts.c.dedupe_key.startswith(f"redrive:{run_id}:"))
                        .order_by(alerts.c.id.desc()).limit(limit))
    return [StopAlert(a.dedupe_key, a.title, a.body, a.mac, a.created_at) for a in rows]
_OWNERS = select(runs.c.id, runs.c.owner, runs.c.source).where(runs.c.id.in_(bindparam("b_ids", expanding=True)))


def owners_of(conn: Connection, run_ids: Sequence[str]) -> dict[str, RunOwner]:
    """run id -> (its `owner` column, its `source`): PostgreSQL's owner is the login that
    inserted it (NULL on SQLite); the source, the witness that created it."""
    out: dict[str, RunOwner] = {}
    for i in range(0, len(run_ids), 500):
        out.update((rid, RunOwner(owner, source))
                   for rid, owner, source in conn.execute(_OWNERS, {"b_ids": list(run_ids[i:i + 500])}))
    return out


def whole_run(conn: Connection, run_id: str) -> RunRow | None:
    """One run's whole row (its free text bounded), or None."""
    from watchdog.store.schema import WHOLE_RUN

    row = conn.execute(select(*WHOLE_RUN).where(runs.c.id == run_id)).first()
    return None if row is None else RunRow.from_mapping(row._mapping)


# -- Child runs in the store: a run's descendants, its lock order, the child that spent most ------------

MAX_DEPTH = 32  # a parent_id chain (or cycle, in a row written by hand) is never followed further


def descendants(conn: Connection, run_id: str) -> list[RunRow]:
    """Every run below `run_id` (children, grandchildren...), each once, cycles cut."""
    tree = select(runs.c.id, literal(1).label("depth")).where(runs.c.parent_id == run_id).cte("tree", recursive=True)
    tree = tree.union(select(runs.c.id, (tree.c.depth + 1).label("depth"))
                      .where(and_(runs.c.parent_id == tree.c.id, tree.c.depth < MAX_DEPTH)))
    ids = set(conn.execute(select(tree.c.id)).scalars()) - {run_id}
    if not ids:
        return []
    rows = conn.execute(select(*WHOLE_RUN).where(runs.c.id.in_(sorted(ids))))
    return [RunRow.from_mapping(r._mapping) for r in rows]


def lock_family(conn: Connection, run_id: str) -> None:
    """PostgreSQL: lock the run's descendants, deepest first, before the run itself is written.
    An agent's record locks its own run, then its ancestors (the roll-up); a stop that wrote the
    parent first, then its children, would lock them the other way round: a deadlock."""
    if conn.dialect.name != "postgresql":
        return  # SQLite: one writer at a time
    tree = select(runs.c.id, literal(1).label("depth")).where(runs.c.parent_id == run_id).cte("tree", recursive=True)
    tree = tree.union(select(runs.c.id, (tree.c.depth + 1).label("depth"))
                      .where(and_(runs.c.parent_id == tree.c.id, tree.c.depth < MAX_DEPTH)))
    deepest: dict[str, int] = {}
    for rid, depth in conn.execute(select(tree.c.id, tree.c.depth)):
        deepest[rid] = max(depth, deepest.get(rid, 0))
    for rid in sorted(deepest, key=lambda r: (-deepest[r], r)):
        if rid != run_id:
            conn.execute(select(runs.c.id).where(runs.c.id == rid).with_for_update())


def children_of(conn: Connection, run_id: str) -> list[RunRow]:
    """The direct children of a run, oldest first."""
    return [RunRow.from_mapping(r._mapping) for r in conn.execute(
        select(*WHOLE_RUN).where(runs.c.parent_id == run_id).order_by(runs.c.started_at, runs.c.id))]


def child_line(child: RunRow) -> str:
    outcome = child.status + (f" ({child.stop_reason})" if child.stop_reason else "")
    return (f"{child.agent} run {child.id[:8]}: {child.cost_eur:.4f} EUR, {child.steps} steps, "
            f"{child.tool_calls} tool calls, {outcome}")


def with_top_child(conn: Connection, row: Any, f: RunFacts) -> RunFacts:
    """The facts of a parent run with its child that spent most (money, then steps) named."""
    top = conn.execute(select(*WHOLE_RUN).where(runs.c.parent_id == row.id)
                       .order_by(desc(runs.c.cost_eur), desc(runs.c.steps), desc(runs.c.tool_calls)).limit(1)).first()
    return dataclasses.replace(f, top_child=child_line(RunRow.from_mapping(top._mapping))) if top is not None else f


# -- After a jump of the store's clock: the active runs' times moved onto the new clock -----------------

TIME_COLUMNS = ("started_at", "last_seen_at", "paused_at", "stop_requested_at")


def _each(conn: Connection, fn: Callable[[], int]) -> int:
    """`fn()` in a SAVEPOINT of its own: one row written by hand (a time that does not parse, or
    that the checks refuse) is left as it is and costs no other row its rebase."""
    try:
        with conn.begin_nested():
            return fn()
    except Exception as exc:  # noqa: BLE001
        if store_unavailable(exc):
            raise
        return 0


def rebase_active_runs(conn: Connection, rebased: Callable[[dt.datetime | None], dt.datetime | None]) -> int:
    """Apply `rebased` (watchdog.daemon.tick.clock.Jump.rebased) to the active runs' times; the rows changed."""
    cols = [runs.c[name] for name in TIME_COLUMNS]
    ids = conn.execute(select(runs.c.id).where(runs.c.status.in_(lc.ACTIVE_STATUSES))).scalars().all()

    def one(rid: str) -> int:
        row = conn.execute(select(runs.c.id, *cols).where(runs.c.id == rid)).first()
        if row is None:
            return 0
        values: dict[str, dt.datetime | None] = {}
        for name in TIME_COLUMNS:
            old = getattr(row, name)
            if old is None:
                continue
            if old.tzinfo is None:  # SQLite: naive UTC
                old = old.replace(tzinfo=dt.timezone.utc)
            new = rebased(old)
            if new != old:
                values[name] = new
        if not values:
            return 0
        # Unchanged since read: a record written meanwhile already carries the new clock's time.
        same = [runs.c[name] == getattr(row, name) for name in values]
        return conn.execute(update(runs).where(and_(runs.c.id == row.id, *same)).values(**values)).rowcount

    return sum(_each(conn, functools.partial(one, rid)) for rid in ids)


def rebase_pending_alerts(conn: Connection, rebased: Callable[[dt.datetime | None], dt.datetime | None]) -> int:
    """The same for the next attempt of the alerts not delivered yet; the rows changed."""
    ids = conn.execute(select(alerts.c.id).where(and_(alerts.c.delivered_at.is_(None),
                                                      alerts.c.next_attempt_at.is_not(None)))).scalars().all()

    def one(aid: int) -> int:
        row = conn.execute(select(alerts.c.id, alerts.c.next_attempt_at).where(alerts.c.id == aid)).first()
        if row is None or row.next_attempt_at is None:
            return 0
        old = row.next_attempt_at if row.next_attempt_at.tzinfo else row.next_attempt_at.replace(tzinfo=dt.timezone.utc)
        new = rebased(old)
        if new == old:
            return 0
        return conn.execute(update(alerts).where(and_(alerts.c.id == row.id,
                                                      alerts.c.next_attempt_at == row.next_attempt_at))
                            .values(next_attempt_at=new)).rowcount

    return sum(_each(conn, functools.partial(one, aid)) for aid in ids)


# -- A run's stop in the store: the request (status, reason, audit row), its children's, a run ---------------------

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
    if not move(conn, run_id, lc.STOPPING, was=lc.STOPPABLE_STATUSES, stop_reason=reason,
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
        # The parent's agent name and id are its writer's text: marked (watchdog.core.text), and
        # the parent's own detail is not repeated (it may quote its writer), only its reason's words.
        why = (f"its parent run {ident(row.id)} ({marked(row.agent)}) was stopped: "
               f"{reason_of(reason)}")[:DETAIL_CHARS]
        if move(conn, child.id, lc.STOPPING, was=lc.STOPPABLE_STATUSES, stop_reason=reason,
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
    if not move(conn, run_id, lc.LOST, was=lc.ACTIVE_STATUSES, stop_reason=lc.PROCESS_GONE,
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


def tool_events() -> ColumnElement[bool]:
    """The events that count for a run's tools: its tool calls, and the failed results a witness
    appended after a call it counted before it ran (a coding CLI's hook: a heartbeat naming the
    tool, ok false, watchdog.store.hooks.count_failed): an error of that tool, never a call."""
    return or_(events.c.kind == lc.EV_TOOL,
               and_(events.c.kind == lc.EV_HEARTBEAT, events.c.ok.is_(False), events.c.tool.is_not(None)))


def tool_calls_sum() -> ColumnElement[Any]:
    return func.sum(case((events.c.kind == lc.EV_TOOL, 1), else_=0))


def tool_errors_sum() -> ColumnElement[Any]:
    return func.sum(case((events.c.ok.is_(False), 1), else_=0))


def top_tool(conn: Connection, run_id: str) -> ToolCount | None:
    """The run's most called tool from its append-only events: (name, calls, errors); its errors
    include the failed results appended after the calls (tool_events)."""
    calls, errors = tool_calls_sum(), tool_errors_sum()
    row = conn.execute(
        select(events.c.tool, calls.label("calls"), errors.label("errors"))
        .where(and_(events.c.run_id == run_id, tool_events(), events.c.tool.is_not(None)))
        .group_by(events.c.tool).having(calls > 0).order_by(calls.desc(), errors.desc(), events.c.tool)
        .limit(1)).first()
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
