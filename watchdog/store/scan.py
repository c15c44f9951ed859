"""The tick's reads of active runs and new events, each row or event read so that one bad one costs only itself.

Reading rows anyone may have written by hand: one bad row or event costs only itself.

The tick reads runs, events and steps in chunks; a value that does not parse (a timestamp
written as 'garbage', labels that are not JSON, a year-20000 date PostgreSQL accepts and
Python does not) fails the whole chunk. Here a failed chunk is read again key by key, and
what still fails becomes a Defect, which the tick reports once (watchdog.daemon.trust.quarantine).

The tick's reads of active runs and new events (watchdog.daemon.trust.scan folds them).

Each read is one statement on the tick's own read snapshot (the caller's connection). Rows
anyone may have written by hand can hold values that do not parse: the reads that meet them
take the caller's `isolated` reader (watchdog.daemon.trust.scan.read_isolated), which reads a
failed chunk again key by key so that one bad row costs only itself.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Collection, NamedTuple, Protocol, Sequence, cast

from sqlalchemy import Select, Text, and_, bindparam, exists, func, or_, select, text, cast as sql_cast, Table
from sqlalchemy.engine import Connection, Row
from sqlalchemy.exc import OperationalError
from sqlalchemy.sql import ColumnElement, Executable

from watchdog.core import lifecycle as lc
from watchdog.core.budgets import RUN_BUDGET_KEYS
from watchdog.store import dialects
from watchdog.store.changes import ChangeFeed, reach_clause
from watchdog.store.engine import store_unavailable
from watchdog.store.schema import events, runs, WHOLE_RUN
from watchdog.store.shards import Reach, bucket_mask_sql


CHUNK = 500
SUSPECTS_MAX = 10_000  # a flood of bad rows costs chunk re-reads, never memory


@dataclass(frozen=True)
class Defect:
    """A run or event the tick could not read or judge: it costs only itself (quarantine.py
    reports it once). `detail` is the daemon's own words (a column and what it holds), never
    the stored value: any store writer chooses that text."""

    run_id: str | None
    detail: str
    event_id: int | None = None


class _Savepoints:
    always = False  # this process met a read the server itself failed: savepoints from then on


@contextmanager
def chunk_read(conn: Connection) -> Iterator[None]:
    """Around one read of rows that may hold a bad value, so that its failure leaves the
    snapshot usable for the reads after it. Where such a failure happens in the driver
    (Dialect.reads_fail_in_driver), no SAVEPOINT and RELEASE round trips around every read:
    should the server fail one after all (its transaction then refuses every later statement),
    that is raised as an outage (the tick is retried) and this process uses savepoints from then on."""
    if not dialects.of(conn).reads_fail_in_driver or _Savepoints.always:
        with conn.begin_nested():
            yield
        return
    try:
        yield
    except Exception as exc:
        if not store_unavailable(exc) and dialects.of(conn).transaction_failed(conn):
            _Savepoints.always = True
            raise OperationalError("a chunk read the server failed", None, exc) from exc
        raise


def _probe(conn: Connection, table: Table, key_col: ColumnElement[Any], key: Any, cols: Sequence[str]) -> str:
    """Which columns of one row cannot be read (the row already failed as a whole)."""
    bad = []
    for c in cols:
        try:
            with conn.begin_nested():
                conn.execute(select(table.c[c]).where(key_col == key)).all()
        except Exception as exc:  # noqa: BLE001 — any failure names the column
            if store_unavailable(exc):
                raise
            bad.append(c)
    what = ", ".join(bad) if bad else "the row"
    return f"{what} cannot be read (not valid for its type)"


def read_isolated(conn: Connection, query_for: Callable[[list[Any]], Executable], keys: list[Any], *,
                  table: Table, key_col: ColumnElement[Any], defects: list[Defect], suspects: dict[Any, str],
                  event: bool = False) -> list[Row[Any]]:
    """`query_for(chunk of keys)` for every chunk; a chunk that fails to read (one value that
    does not parse) is read again key by key, and a key that still fails becomes a Defect:
    one bad row never hides the others. Each read is its own SAVEPOINT, so a failed one
    leaves the snapshot usable on PostgreSQL.

    `suspects` (key -> what was wrong), kept by the caller across ticks: the keys that failed
    last time are read on their own, so a bad row that stays costs one query per tick and
    never fails (and re-reads) its chunk again; one that was fixed reads normally."""
    out: list[Row[Any]] = []
    alone = [k for k in keys if k in suspects]
    rest = [k for k in keys if k not in suspects] if alone else keys
    failed_now: dict[Any, str] = {}

    def one(key: Any) -> None:
        try:
            with conn.begin_nested():
                out.extend(conn.execute(query_for([key])).all())
            return
        except Exception as exc:  # noqa: BLE001
            if store_unavailable(exc):
                raise
        detail = suspects.get(key) or _probe(conn, table, key_col, key, [c.name for c in table.c])
        failed_now[key] = detail
        if event:
            rid = conn.execute(select(events.c.run_id).where(events.c.id == key)).scalar()
            defects.append(Defect(rid if isinstance(rid, str) else None, f"event {key}: {detail}", key))
        else:
            defects.append(Defect(key, detail))

    for key in alone:
        one(key)
    for i in range(0, len(rest), CHUNK):
        part = rest[i : i + CHUNK]
        try:
            with chunk_read(conn):
                out.extend(conn.execute(query_for(part)).all())
            continue
        except Exception as exc:  # noqa: BLE001
            if store_unavailable(exc):
                raise
        for key in part:
            one(key)
    for key in alone:
        if key not in failed_now:
            del suspects[key]  # fixed
    suspects.update(failed_now)
    if len(suspects) > SUSPECTS_MAX:
        suspects.clear()
    return out


# -- The tick's reads of active runs and new events (watchdog.daemon.trust.scan folds them) ------------------------

# What the tick reads of EVERY active run, each tick: enough to tell whether the run needs
# a full evaluation. The two timestamps come back as epoch seconds computed by the
# database, so no datetime (and no row of 31 columns) is built for a healthy run.
# Columns are read by position (a Row's attribute access costs at 10,000 runs): `L` names them.
IDENTITY = ("id", "agent", "status", "host", "pid", "pid_create_time", "resumes")
# The counters the registry's budgets measure, as the run row holds them ("tokens" is in + out).
MEASURES = ("steps", "tool_calls", "cost_eur", "tokens")
# parent_id last: the daemon records the parent a run names when it first sees it (issue 20).
LIGHT = (*IDENTITY, *RUN_BUDGET_KEYS, *MEASURES, "started_s", "seen_s", "parent_id")
L = {name: i for i, name in enumerate(LIGHT)}
OWN_BUDGETS = slice(L[RUN_BUDGET_KEYS[0]], L[RUN_BUDGET_KEYS[-1]] + 1)

# The events the fold reads: tool calls (stats, circuits) and steps (the evidence counters).
FOLDED = (lc.EV_TOOL, lc.EV_STEP)


@dataclass(slots=True)
class FoldedEvent:
    """An event as the fold reads it: values as stored (the caller checks them, event_defect)."""

    id: int
    run_id: str
    at: dt.datetime
    tool: str
    args_hash: str | None
    ok: bool | None
    error_msg: str | None
    attempt: int | None = None
    # issue 20: what the evidence fold counts (watchdog.daemon.trust.scan)
    kind: str = lc.EV_TOOL
    tokens_in: int | None = None
    tokens_out: int | None = None
    cost_eur: float | None = None
    source: str | None = None
    call_id: str | None = None


_EVENT_COLS = (events.c.id, events.c.run_id, events.c.at, events.c.tool, events.c.args_hash, events.c.ok,
               events.c.error_msg, events.c.attempt, events.c.kind, events.c.tokens_in, events.c.tokens_out,
               events.c.cost_eur, events.c.source, events.c.call_id)


class IsolatedRead(Protocol):
    """watchdog.daemon.trust.scan.read_isolated's shape: `query_for(chunk of keys)` per chunk, a
    failed chunk read again key by key, a key that still fails appended to `defects`."""

    def __call__(self, conn: Connection, query_for: Callable[[list[Any]], Any], keys: list[Any], *, table: Any,
                 key_col: Any, defects: list[Any], suspects: dict[Any, Any], event: bool = False) -> list[Any]: ...


_SELECTS: dict[tuple[str, str], Any] = {}  # (dialect name, which) -> a SELECT built once (~2 ms each time)


def _light_select(conn: Connection, *, with_seq: bool = False) -> Any:
    key = (conn.dialect.name, "light+seq" if with_seq else "light")
    q = _SELECTS.get(key)
    if q is None:
        backend = dialects.of(conn)
        measures: dict[str, Any] = {"tokens": backend.integer_sum(runs.c.tokens_in, runs.c.tokens_out)}
        q = select(*(runs.c[c] for c in (*IDENTITY, *RUN_BUDGET_KEYS)),
                   *(measures[m] if m in measures else runs.c[m] for m in MEASURES),
                   backend.epoch_s(runs.c.started_at), backend.epoch_s(runs.c.last_seen_at), runs.c.parent_id)
        if with_seq:
            q = q.add_columns(runs.c.change_seq)
        _SELECTS[key] = q
    return q


_I_SEQ = len(LIGHT)  # changed_light's rows: the LIGHT columns, then change_seq


class ChangedLight(NamedTuple):
    rows: list[Any]  # the light rows of the changed runs still active, of the hosts asked for
    ids: frozenset[str]  # every run that changed, ended ones and other hosts' too
    ended: bool  # some of them are no longer active (ended, or deleted)
    unreadable: int  # changed rows whose id or number could not be read
    high_water: int  # the highest change number in this snapshot (ChangeFeed: numbers that went back)


def changed_light(conn: Connection, feed: ChangeFeed, hosts: Collection[str] | None = None) -> ChangedLight:
    """The change feed's read, as light rows (issue 25). One range read of the change_seq index:
    O(changed)."""
    reach = hosts if isinstance(hosts, Reach) else None  # a sharded judge's: confined in SQL
    got = feed.read_rows(conn, "tick light", _light_select(conn, with_seq=True),
                         i_id=L["id"], i_seq=_I_SEQ, reach=reach)
    i_id, i_status, i_host = L["id"], L["status"], L["host"]
    wanted = None if hosts is None or reach is not None else frozenset(hosts)
    active = [r for r in got.rows if r[i_status] in lc.ACTIVE_STATUSES]
    rows = active if wanted is None else [r for r in active if r[i_host] in wanted]
    ended = len({r[i_id] for r in active}) < len(got.ids)
    return ChangedLight(rows, got.ids, ended, got.unreadable, got.high_water)


def active_light(conn: Connection, hosts: Collection[str] | None = None) -> list[Any]:
    """Every active run (of `hosts`, None = all), light: the LIGHT columns by position."""
    q = _light_select(conn).where(runs.c.status.in_(lc.ACTIVE_STATUSES))
    if isinstance(hosts, Reach):  # a sharded judge: its hosts' runs and its shards' (watchdog.store.shards)
        q = q.where(reach_clause(hosts))
    elif hosts is not None:
        q = q.where(runs.c.host.in_(sorted(hosts)))
    return cast(list[Any], conn.execute(q).all())  # a list (fetchall), typed as a Sequence


def active_rows(conn: Connection, ids: list[str], *, isolated: IsolatedRead, defects: list[Any],
                suspects: dict[Any, Any]) -> list[Any]:
    """The whole rows of these runs, if still active; a row that cannot be read becomes a defect."""
    return isolated(conn, lambda part: select(*WHOLE_RUN).where(and_(
        runs.c.id.in_(part), runs.c.status.in_(lc.ACTIVE_STATUSES))), ids,
        table=runs, key_col=runs.c.id, defects=defects, suspects=suspects)


def newest_event_id(conn: Connection) -> int | None:
    """The largest event id (None: no event yet): one probe of the primary key's index."""
    top: int | None = conn.execute(select(func.max(events.c.id))).scalar()
    return top


def commits_late(conn: Connection) -> bool:
    """Whether an id below the newest one read may still commit (PostgreSQL); SQLite commits one
    writer at a time, in id order."""
    return not dialects.of(conn).commits_in_order


def _on_hosts(q: Select[Any], on_hosts: bool | str) -> Select[Any]:
    """Only the events of runs on the hosts bound as `b_hosts`: a join on the run's primary key,
    cheap for the few events above the high-water mark. `on_hosts == "reach"` (a sharded judge,
    watchdog.store.shards.Reach): also every event whose stored bucket is in `b_mask` (the Reach's
    bit mask), on any host (the join only for the others)."""
    if not on_hosts:
        return q
    if on_hosts == "reach":
        # One parameter each (PostgreSQL): an IN of 256 parameters made the driver parse a long
        # statement again every tick, which cost more than the read; an array of the buckets cost
        # its dump per statement and a compare per bucket per row; the mask, one get_bit.
        theirs = exists().where(runs.c.id == events.c.run_id, text("runs.host = ANY(:b_hosts)"))
        return q.where(or_(text(bucket_mask_sql("events.shard", ":b_mask")), theirs))
    on_host = runs.c.host.in_(bindparam("b_hosts", expanding=True))
    return q.join_from(events, runs, runs.c.id == events.c.run_id).where(on_host)


_FOLDED: dict[tuple[str, bool | str, bool], Any] = {}


def _on(hosts: Collection[str] | None) -> bool | str:
    return "reach" if isinstance(hosts, Reach) else hosts is not None


def _folded_between(what: str, on_hosts: bool | str, bounded: bool) -> Any:
    """The folded events with an id above `b_low` (and, `bounded`, at most `b_high`), of runs on
    `b_hosts` (`on_hosts`), in id order: their whole rows ("rows"), their ids ("ids"), their
    count and id sum ("sum"), and with them the read snapshot's oldest transaction still in
    flight and a bound above every transaction id given so far ("sum+snapshot", PostgreSQL).
    Built once per shape: the tick reads them every time."""
    key = (what, on_hosts, bounded)
    q = _FOLDED.get(key)
    if q is None:
        cond = and_(events.c.id > bindparam("b_low", type_=events.c.id.type), events.c.kind.in_(FOLDED))
        if bounded:
            cond = and_(cond, events.c.id <= bindparam("b_high", type_=events.c.id.type))
        if what.startswith("sum"):
            sums: list[Any] = [func.count(), func.coalesce(func.sum(events.c.id), 0)]
            if what == "sum+snapshot":  # xid8 as text: no driver type for it
                # pg_current_xact_id() gives this read an id now: every id given before is below it
                # (the snapshot's xmax is not: it is the newest *ended* one + 1, and a transaction
                # still running may hold a larger one).
                sums += [sql_cast(func.pg_snapshot_xmin(func.pg_current_snapshot()), Text),
                         sql_cast(func.pg_current_xact_id(), Text)]
            q = _on_hosts(select(*sums).where(cond), on_hosts)
        else:
            cols = _EVENT_COLS if what == "rows" else _CALL_COLS if what == "calls" else (events.c.id,)
            q = _on_hosts(select(*cols).where(cond), on_hosts).order_by(events.c.id)
        _FOLDED[key] = q
    return q


def _folded_params(low: int, high: int | None, hosts: Collection[str] | None) -> dict[str, Any]:
    params: dict[str, Any] = {"b_low": low, "b_high": high}
    if hosts is not None:
        params["b_hosts"] = sorted(hosts)
    if isinstance(hosts, Reach):
        params["b_mask"] = hosts.mask
    return params


def folded_ids_between(conn: Connection, low: int, high: int, hosts: Collection[str] | None = None) -> list[int]:
    """The ids of the folded events in (low, high] (of runs on `hosts`), ids only: cheap (read with
    one fetchall: a fetch per id cost more than the query, at ~2,000 ids each tick)."""
    q = _folded_between("ids", _on(hosts), True)
    return list(conn.execute(q, _folded_params(low, high, hosts)).scalars().all())


# The few columns the store-wide tool watch needs of a folded event (watchdog.daemon.tick.toolwatch)
_CALL_COLS = (events.c.id, events.c.kind, events.c.tool, events.c.ok, events.c.at, events.c.cost_eur)


def calls_above(conn: Connection, low: int) -> list[Any]:
    """(id, kind, tool, ok, at, cost_eur) of every folded event above `low`, every run's, in id
    order: the columns the circuits, the all-runs tool rate and the money's unpriced steps need,
    not the fold's whole rows."""
    return cast(list[Any], conn.execute(_folded_between("calls", False, False), _folded_params(low, None, None)).all())


def calls_of(conn: Connection, *, run_ids: Sequence[str] = (), event_ids: Sequence[int] = ()) -> list[Any]:
    """calls_above's columns for the folded events of these runs (a cold start: their history) or
    of these ids (those committed late below the mark), in id order."""
    cond = events.c.run_id.in_(list(run_ids)) if run_ids else events.c.id.in_(list(event_ids))
    q = select(*_CALL_COLS).where(and_(cond, events.c.kind.in_(FOLDED))).order_by(events.c.id)
    return cast(list[Any], conn.execute(q).all())


class WindowSum(NamedTuple):
    """folded_sum_between's answer."""

    n: int
    total: int  # the sum of their ids
    # PostgreSQL: the read snapshot's oldest transaction still in flight (every older one has
    # ended: pg_snapshot_xmin) and a transaction id above every one given before this read
    # (pg_current_xact_id); None on SQLite.
    xmin: int | None = None
    xid_bound: int | None = None


def folded_sum_between(conn: Connection, low: int, high: int, hosts: Collection[str] | None = None) -> WindowSum:
    """How many folded events in (low, high] (of runs on `hosts`) and the sum of their ids: one
    row, where folded_ids_between returns thousands; equal to a reader's own count and sum of
    the ids it read there, nothing it has not read committed since."""
    pg = conn.dialect.name == "postgresql"
    q = _folded_between("sum+snapshot" if pg else "sum", _on(hosts), True)
    row = conn.execute(q, _folded_params(low, high, hosts)).one()
    if not pg:
        n, total = row
        return WindowSum(int(n), int(total))
    n, total, xmin, xid_bound = row
    return WindowSum(int(n), int(total), int(xmin), int(xid_bound))


@dataclass(frozen=True)
class EventSelection:
    """Which events a read_events call reads (build one with the class methods)."""

    query_for: Callable[[Sequence[Any]], Select[Any]]  # columns -> the SELECT of those columns, in id order
    params: dict[str, Any] = field(default_factory=dict)  # its bound values

    @classmethod
    def of_runs(cls, run_ids: Sequence[str]) -> EventSelection:
        """The folded events of these runs (a cold start: all of their history)."""
        ids = list(run_ids)
        return cls(lambda cols: select(*cols).where(and_(events.c.run_id.in_(ids), events.c.kind.in_(FOLDED)))
                   .order_by(events.c.id))

    @classmethod
    def by_ids(cls, event_ids: Sequence[int]) -> EventSelection:
        ids = list(event_ids)
        return cls(lambda cols: select(*cols).where(events.c.id.in_(ids)).order_by(events.c.id))

    @classmethod
    def folded_above(cls, high: int, hosts: Collection[str] | None = None) -> EventSelection:
        """The folded events above `high` (of runs on `hosts`): the read of every tick."""
        return cls(lambda cols: _folded_between("rows" if cols is _EVENT_COLS else "ids", _on(hosts), False),
                   _folded_params(high, None, hosts))


def read_events(conn: Connection, selection: EventSelection, *, isolated: IsolatedRead,
                defects: list[Any]) -> tuple[list[FoldedEvent], list[int]]:
    """(the selected events in id order, the ids of those that could not be read at all).

    The usual case is one query; if it fails (one event whose timestamp does not parse), the
    ids alone are read (integers always read) and the rows by id, each bad event becoming a
    defect: the caller's high-water mark moves past it, it is never read again."""
    try:
        with chunk_read(conn):
            rows = conn.execute(selection.query_for(_EVENT_COLS), selection.params).all()
    except Exception as exc:  # noqa: BLE001
        if store_unavailable(exc):
            raise
    else:
        return [FoldedEvent(*r) for r in rows], []
    ids = list(conn.execute(selection.query_for((events.c.id,)), selection.params).scalars())
    rows = isolated(conn, lambda part: select(*_EVENT_COLS).where(events.c.id.in_(part)), ids,
                    table=events, key_col=events.c.id, defects=defects, suspects={}, event=True)
    rows.sort(key=lambda r: r[0])
    unreadable = sorted(set(ids) - {r[0] for r in rows})
    return [FoldedEvent(*r) for r in rows], unreadable
