"""What a witness outside the run's process writes: runs it saw start, the calls it saw, their ends.

The OTLP receiver (watchdog.daemon.otlp) is the first user. Every event carries the witness's
`source` and, where the witnesses share one, the call's `call_id`: a call already in the run
under that id is not counted again (one call, one count). Steps are written unpriced (cost
NULL, their tokens in `cost_unpriced_tokens`): the daemon's backfill prices them within the
tick, like any step an SDK could not price; a step the daemon gives a cost (a coding CLI's
claimed cost for a model no price table knows: watchdog.daemon.otlp.logruns) is written with it,
onto the run's cost. Times are the store's clock: the server's now()
on PostgreSQL, this host's on SQLite.
"""

from __future__ import annotations

import datetime as dt
import functools
import json
import math
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Sequence

from sqlalchemy import and_, select
from sqlalchemy.engine import Connection

from watchdog.core import lifecycle as lc
from watchdog.core.interventions import Action
from watchdog.store import run_rows, dialects
from watchdog.store.alerts import record
from watchdog.store.dialects import Dialect
from watchdog.store.joined import WITNESS_SEQ_BASE
from watchdog.store.attestations import Attestation, replace as replace_attestation
from watchdog.store.schema import events, runs


@dataclass(frozen=True)
class WitnessedCall:
    """One step or tool call a witness saw (tokens for steps, tool fields for tool calls)."""

    kind: str  # lifecycle EventKind: step | tool
    tool: str | None = None
    args_hash: str | None = None
    ok: bool | None = None
    error_class: str | None = None
    error_msg: str | None = None
    duration_s: float | None = None
    model: str | None = None
    tokens_in: int | None = None
    tokens_out: int | None = None
    cached_tokens_in: int | None = None
    call_id: str | None = None
    cost_eur: float | None = None  # a step's cost as written (a sender's claim the daemon took), else unpriced


@dataclass(frozen=True)
class RunRef:
    id: str
    source: str
    status: str
    host: str
    kill_mode: str


def store_now(conn: Connection) -> dt.datetime:
    """The store's clock (as the daemon's tick reads it)."""
    return dialects.of(conn).db_now(conn)


def active_runs_of(conn: Connection, source: str, host: str) -> list[tuple[str, dict[str, Any] | None]]:
    """(id, labels) of the active runs `source` created on `host`: what a witness rebuilds its
    key → run cache from after a restart."""
    q = select(runs.c.id, runs.c.labels).where(and_(runs.c.source == source, runs.c.host == host,
                                                    runs.c.status.in_(lc.ACTIVE_STATUSES)))
    return [(r.id, r.labels if isinstance(r.labels, dict) else None) for r in conn.execute(q)]


def run_ref(conn: Connection, run_id: str) -> RunRef | None:
    r = conn.execute(select(runs.c.id, runs.c.source, runs.c.status, runs.c.host, runs.c.kill_mode)
                     .where(runs.c.id == run_id)).first()
    return None if r is None else RunRef(r.id, r.source, r.status, r.host, r.kill_mode)


def create_run(conn: Connection, *, run_id: str, agent: str, source: str, host: str, kill_mode: str,
               labels: dict[str, Any] | None, pid: int | None = None, pid_create_time: float | None = None,
               now: dt.datetime, owner: str | None = None, parent_id: str | None = None) -> None:
    """`owner`: who sent what the run was started for (SQLite; on PostgreSQL the database sets
    the column to the daemon's login, and the sender is in the run's sealed attestation).
    `parent_id`: the run it is a child of (a coding CLI's sub-agent: its session's run)."""
    sql = _sql(dialects.of(conn))
    at = sql.dialect.ts(now)
    cur = conn.connection.cursor()
    try:
        cur.execute(sql.insert_run, (run_id, agent, lc.RUNNING, kill_mode, host, pid, pid_create_time,
                                     sql.dialect.json(labels), at, at, source, owner, parent_id))
    finally:
        cur.close()


def pin_process(conn: Connection, attestation: Attestation) -> None:
    """The daemon's own attestation of a process the kernel confirmed (sealed by the caller)."""
    replace_attestation(conn, attestation)


def known_call_ids(conn: Connection, run_id: str, call_ids: Sequence[str]) -> set[str]:
    if not call_ids:
        return set()
    q = select(events.c.call_id).where(and_(events.c.run_id == run_id, events.c.call_id.in_(sorted(set(call_ids)))))
    return set(conn.execute(q).scalars())


MacFn = Callable[[int, Any, "str | None"], str]  # (seq, call, the event's time as written) -> events.mac


def append(conn: Connection, run_id: str, calls: Iterable[WitnessedCall | Any], *, source: str,
           now: dt.datetime, new: bool = False, joined: bool = False, mac: MacFn | None = None) -> bool:
    """The calls (WitnessedCall, or any object with its fields) as events of the run and onto its
    counters, in the caller's transaction; a span
    arrival with no call is progress (last_seen_at). False if the run is not active (nothing written).
    `new`: the run was created in this transaction (its seq starts at 0: no read).
    `joined`: the run has a writer of its own (exec's): the events take numbers from
    WITNESS_SEQ_BASE up and last_seq is left alone, so the writer's own records 1, 2, ... (MACed
    over their seq) never find their number taken by a witness.
    `mac`: the MAC of each event (the daemon's receiver, for a run whose sender it pinned), so
    that what it saw is the run's own evidence (watchdog.core.evidence_mac), not its row's counters."""
    calls = list(calls)
    ids = [c.call_id for c in calls if c.call_id]
    if ids:
        seen = known_call_ids(conn, run_id, ids)
        fresh, taken = [], set(seen)
        for c in calls:
            if c.call_id and c.call_id in taken:
                continue  # another witness (or an earlier export) counted this call
            if c.call_id:
                taken.add(c.call_id)
            fresh.append(c)
        calls = fresh
    steps, tools, costs, unpriced = _tally(calls)
    sql = _sql(dialects.of(conn))
    at = sql.dialect.ts(now)
    # Plain SQL text rendered once per dialect, on the transaction's own DBAPI cursor (as the SDK's
    # hot path): building Core statements per request cost more than the database.
    cur = conn.connection.cursor()
    try:
        if new:
            base = 0
        else:
            # The run row first, locked on PostgreSQL (FOR UPDATE): the seq base is this transaction's alone.
            cur.execute(sql.joined_seq_base if joined else sql.seq_base,
                        (run_id, WITNESS_SEQ_BASE, run_id) if joined else (run_id, run_id))
            found = cur.fetchone()
            if found is None:
                return False  # not active (ended): nothing written
            base = max(found[1] or 0, WITNESS_SEQ_BASE - 1) if joined else max(found[0] or 0, found[1] or 0)
        cur.execute(sql.counters, (
            len(steps), len(tools), sum(1 for c in tools if c.ok is False), sum(c.tokens_in or 0 for c in steps),
            sum(c.tokens_out or 0 for c in steps), sum(c.cached_tokens_in or 0 for c in steps), unpriced,
            sum(costs.values()), at, 0 if joined else base + len(calls), run_id))
        if calls:
            at_text = at if isinstance(at, str) else None
            _insert_events(cur, sql, [
                (run_id, base + i, at, c.kind, c.tool, c.args_hash, c.ok, c.error_class, c.error_msg, c.duration_s,
                 c.model, c.tokens_in, c.tokens_out, c.cached_tokens_in,
                 costs.get(id(c), _unpriced_cost(c)), source, c.call_id,
                 None if mac is None else mac(base + i, c, at_text))
                for i, c in enumerate(calls, start=1)])
    finally:
        cur.close()
    return True


MAX_STEP_COST_EUR = 1e9  # a step's written cost, at most


def _tally(calls: list[Any]) -> tuple[list[Any], list[Any], dict[int, float], int]:
    """(steps, tool calls, id(step) -> the cost it is written with, the other steps' tokens)."""
    steps = [c for c in calls if c.kind == lc.EV_STEP]
    tools = [c for c in calls if c.kind == lc.EV_TOOL]
    costs = {id(c): cost for c in steps if (cost := _cost(c)) is not None}
    unpriced = sum((c.tokens_in or 0) + (c.tokens_out or 0) for c in steps if id(c) not in costs)
    return steps, tools, costs, unpriced


def _unpriced_cost(c: Any) -> float | None:
    """A step without tokens costs nothing; any other is unpriced (NULL) until the daemon prices it."""
    return 0.0 if c.kind == lc.EV_STEP and not (c.tokens_in or c.tokens_out) else None


def _cost(c: Any) -> float | None:
    """A step's cost as written with it: a finite number >= 0, at most MAX_STEP_COST_EUR; None
    (unpriced: the daemon's backfill prices it) for anything else."""
    v = getattr(c, "cost_eur", None)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
        return None
    return min(float(v), MAX_STEP_COST_EUR)


# SQLite: rows a multi-row INSERT (18 parameters each: below the 999 of the oldest SQLite builds).
_SQLITE_ROWS = 50


def _insert_events(cur: Any, sql: _Sql, rows: list[tuple[Any, ...]]) -> None:
    """The events in as few statements as the backend allows (issue 35: a request's spans, a
    burst of calls): on PostgreSQL one statement whatever their number, the rows as one JSON
    array (one statement shape: parsed and planned once, its statement triggers fired once);
    on SQLite multi-row INSERTs of _SQLITE_ROWS rows. Each row exactly as one INSERT would write it."""
    if sql.insert_rows is not None:
        cur.execute(sql.insert_rows, (json.dumps(rows, default=str),))
        return
    for i in range(0, len(rows), _SQLITE_ROWS):
        chunk = rows[i:i + _SQLITE_ROWS]
        if len(chunk) == 1:
            cur.execute(sql.insert_event, chunk[0])
            continue
        one = sql.insert_event.partition(" VALUES ")[2]  # "(?, ?, ...)": one row's
        cur.execute(sql.insert_event + (", " + one) * (len(chunk) - 1), [v for row in chunk for v in row])


_EVENT_COLUMNS = ("run_id", "seq", "at", "kind", "tool", "args_hash", "ok", "error_class", "error_msg", "duration_s",
                  "model", "tokens_in", "tokens_out", "cached_tokens_in", "cost_eur", "source", "call_id", "mac")
# PostgreSQL's type of each, for its cast out of the JSON array a row is sent as.
_EVENT_TYPES = ("text", "int", "timestamptz", "text", "text", "text", "boolean", "text", "text", "float8",
                "text", "bigint", "bigint", "bigint", "float8", "text", "text", "text")


@dataclass(frozen=True)
class _Sql:
    dialect: Dialect
    counters: str
    seq_base: str
    insert_event: str
    insert_run: str
    joined_seq_base: str
    insert_rows: str | None  # PostgreSQL: the events as one JSON array of rows (_insert_events)


@functools.cache
def _sql(d: Dialect) -> _Sql:
    ph, greatest, json_ph = d.ph, d.greatest, d.json_ph
    active = ", ".join(f"'{s}'" for s in lc.ACTIVE_STATUSES)
    return _Sql(
        d,
        f"UPDATE runs SET steps = steps + {ph}, tool_calls = tool_calls + {ph}, tool_errors = tool_errors + {ph}, "
        f"tokens_in = tokens_in + {ph}, tokens_out = tokens_out + {ph}, "
        f"cached_tokens_in = cached_tokens_in + {ph}, cost_unpriced_tokens = cost_unpriced_tokens + {ph}, "
        f"cost_eur = cost_eur + {ph}, "
        f"last_seen_at = {greatest}(last_seen_at, {d.clock_ph}), last_seq = {greatest}(last_seq, {ph}) "
        f"WHERE id = {ph}",
        f"SELECT last_seq, (SELECT MAX(seq) FROM events WHERE run_id = {ph}) FROM runs WHERE id = {ph} "
        f"AND status IN ({active}){d.for_update}",
        f"INSERT INTO events ({', '.join(_EVENT_COLUMNS)}) VALUES ({', '.join(ph for _ in _EVENT_COLUMNS)})",
        f"INSERT INTO runs (id, agent, status, kill_mode, host, pid, pid_create_time, labels, started_at, "
        f"last_seen_at, source, owner, parent_id) VALUES ({ph}, {ph}, {ph}, {ph}, {ph}, {ph}, {ph}, {json_ph}, "
        f"{d.clock_ph}, {d.clock_ph}, {ph}, {ph}, {ph})",
        f"SELECT last_seq, (SELECT MAX(seq) FROM events WHERE run_id = {ph} AND seq >= {ph}) FROM runs WHERE id = {ph} "
        f"AND status IN ({active}){d.for_update}",
        None if d.name != "postgresql" else (
            f"INSERT INTO events ({', '.join(_EVENT_COLUMNS)}) SELECT "
            + ", ".join(f"(r->>{i})" + ("" if t == "text" else f"::{t}") for i, t in enumerate(_EVENT_TYPES))
            + " FROM jsonb_array_elements(%s::jsonb) WITH ORDINALITY AS e(r, n) ORDER BY e.n"),
    )


def complete(conn: Connection, run_id: str, *, now: dt.datetime) -> bool:
    """A running run the witness saw end (its root span) or that went silent: completed, no alert."""
    return run_rows.move(conn, run_id, lc.COMPLETED, was=lc.RUNNING, ended_at=now)


def end_stopped(conn: Connection, run_id: str, *, now: dt.datetime, by: str, outcome: str) -> bool:
    """A stopping run nobody can signal whose witness went silent: killed (its stop took effect)."""
    if not run_rows.move(conn, run_id, lc.KILLED, was=lc.STOPPING, when=runs.c.signal_stage.in_(lc.WAITING_STAGES),
                         ended_at=now, signal_stage=lc.Stage.DONE):
        return False
    record(conn, at=now, action=Action.ENDED, by=by, run_id=run_id, outcome=outcome[:255])
    return True
