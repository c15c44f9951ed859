"""One class per backend: every place where SQLite and PostgreSQL differ, and nowhere else.

A store module never asks `dialect.name == "sqlite"`: it asks its backend for the piece it
needs (a placeholder, the store's clock, GREATEST, a row lock, an upsert, a timestamp in
epoch seconds). A new backend is one new subclass here (and its engine discipline in
`watchdog.store.engine`), not a hunt through every module that renders SQL.
"""

from __future__ import annotations

import datetime as dt
import functools
import json
import sqlite3
import time
from typing import Any, ClassVar

from sqlalchemy import Float, String, and_, case, cast, extract, func, literal
from sqlalchemy.dialects import postgresql as pg
from sqlalchemy.dialects import sqlite as sqlite_sql
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.sql.elements import ColumnElement

# How a timestamp is spelled in SQLite (UTC, no offset). Part of the table contract.
SQLITE_TS_FORMAT = "%Y-%m-%d %H:%M:%S.%f"

# `YYYY-MM-DD HH:MM:SS[.ffffff]` (or with a `T`): how the table contract spells a timestamp on
# SQLite. Readers that must not trust a hand-written value test it with GLOB first.
ISO_GLOB = "[0-9][0-9][0-9][0-9]-[0-1][0-9]-[0-3][0-9][ T][0-2][0-9]:[0-5][0-9]:[0-6][0-9]*"


class Dialect:
    """What one backend spells its own way. Subclasses set the class attributes."""

    name: ClassVar[str]
    sqlite: ClassVar[bool] = False
    ph: ClassVar[str]  # the DBAPI placeholder of pre-rendered statements
    greatest: ClassVar[str]  # the two-argument maximum
    json_ph: ClassVar[str]  # a placeholder whose value is JSON text
    # The store's clock for a record's times (events.at, runs.started_at / last_seen_at /
    # ended_at), as a placeholder: see `seen`.
    clock_ph: ClassVar[str]
    for_update: ClassVar[str]  # a row lock on a SELECT ("" where the write lock is the database's)
    returning: ClassVar[bool]  # UPDATE ... RETURNING
    # The SDK's write path (watchdog.store.agent_writes.Writer), on its raw DBAPI connections:
    write_begin: ClassVar[str]  # how a transaction of several statements begins
    # The connections are in autocommit: a lone statement is its own transaction (no BEGIN, no
    # COMMIT, no round trips for either).
    autocommit_writes: ClassVar[bool]
    # A WITH clause may INSERT: a record's event and its run's counters are one statement.
    modifying_cte: ClassVar[bool]
    # Retention: rows per delete, and the pause after a batch as a share of its duration. SQLite:
    # every writer waits while a batch runs, so a batch stays a few tens of ms and the agents get
    # the lock half the time. PostgreSQL locks only the rows it deletes (no agent writes an ended
    # run's rows): larger batches, shorter pauses, just enough to leave the disk to the agents.
    prune_rows_per_batch: ClassVar[int]
    prune_pause_ratio: ClassVar[float]
    # The store is a local file (SQLite), not a server: it is never down, only missing, so a
    # daemon checks it at start instead of waiting for it; a writer's first connection changes
    # the file (it becomes a WAL database), so its tables are checked read-only first; and the
    # agents' group shares its files (watchdog.store.access).
    embedded: ClassVar[bool] = False
    # Numbers taken from a counter commit in their order: one writer commits at a time (SQLite).
    # Where not (PostgreSQL: a sequence's numbers are taken at once, committed in any order), a
    # reader of "what changed since N" re-reads a window below N (watchdog.store.changes).
    commits_in_order: ClassVar[bool] = False
    # A read of rows anyone may have written fails, when one value is bad, in the driver after the
    # server answered (PostgreSQL: a date past year 9999): its transaction stays usable, so such
    # reads need no SAVEPOINT round trips (watchdog.store.scan.chunk_read). SQLite parses
    # inside the engine: a savepoint, local and free, keeps a failed read from costing the rest.
    reads_fail_in_driver: ClassVar[bool] = False

    def read_only_connect_args(self) -> dict[str, Any]:
        """What makes a connection unable to write, beyond `make_engine(read_only=True)`."""
        return {}

    def ts(self, value: dt.datetime) -> Any:
        """A timestamp as the driver binds it."""
        return value

    def seen(self, value: dt.datetime) -> Any:
        """A value for `clock_ph`."""
        raise NotImplementedError

    def seen_now(self) -> Any:
        """`seen` of the wall clock now: what every record binds, so each backend may do it cheaper."""
        return self.seen(dt.datetime.now(dt.timezone.utc))

    def commit_without_flush(self, conn: Connection, *, session: bool = False) -> None:
        """The commits of this transaction (`session`: of this connection) do not wait for their
        log flush: for the daemon's own bookkeeping (its lease row each tick), which a crash of
        the database may set back by a moment at no cost. SQLite in WAL with synchronous=NORMAL
        does not flush at commit anyway."""

    def has_rows(self, cursor: Any) -> bool:
        """The DBAPI cursor's last statement returned rows (the SDK's Writer fetches then)."""
        return cursor.description is not None

    def read_batch(self, conn: Connection, reads: list[tuple[str, tuple[Any, ...]]]) -> list[list[Any]]:
        """Pre-rendered SELECTs (the driver's placeholders), their rows each, in the connection's
        transaction. A server sends them in one round trip where its driver can."""
        return [list(conn.exec_driver_sql(sql, params).fetchall()) for sql, params in reads]

    def transaction_failed(self, conn: Connection) -> bool:
        """Whether the server failed the connection's transaction (it refuses every later
        statement), as opposed to a value the driver could not turn into Python."""
        return False

    def json(self, value: Any) -> str | None:
        return None if value is None else json.dumps(value, sort_keys=True, default=str)

    def parse_ts(self, value: Any) -> dt.datetime | None:
        if value is None:
            return None
        if isinstance(value, str):
            value = dt.datetime.fromisoformat(value)
        if value.tzinfo is None:
            value = value.replace(tzinfo=dt.timezone.utc)
        return value

    def parse_json(self, value: Any) -> Any:
        return json.loads(value) if isinstance(value, str) else value

    def insert(self, table: Any) -> Any:
        """An INSERT with ON CONFLICT (upserts)."""
        raise NotImplementedError

    def epoch_s(self, col: Any) -> ColumnElement[Any]:
        """A UTCDateTime column as float seconds since the epoch, computed by the database."""
        raise NotImplementedError

    def db_now(self, conn: Connection) -> dt.datetime:
        """The store's clock now."""
        raise NotImplementedError

    def integer_sum(self, a: Any, b: Any) -> ColumnElement[Any]:
        """a + b of two integer counter columns; NULL where the backend would add a value that
        is not an integer (a row written by hand) as if it were one."""
        return a + b


class SQLiteDialect(Dialect):
    name = "sqlite"
    sqlite = True
    ph = "?"
    greatest = "MAX"
    json_ph = "?"
    clock_ph = "?"
    for_update = ""  # BEGIN IMMEDIATE already holds the database's one write lock
    returning = sqlite3.sqlite_version_info >= (3, 35)
    # The write lock up front, where the busy timeout waits for it: a deferred BEGIN that reads and
    # then writes meets SQLITE_BUSY at the upgrade, which no busy handler waits out.
    write_begin = "BEGIN IMMEDIATE"
    autocommit_writes = False  # a record is two statements: always BEGIN IMMEDIATE ... COMMIT
    modifying_cte = False
    prune_rows_per_batch = 2000
    prune_pause_ratio = 1.0
    embedded = True
    commits_in_order = True

    def ts(self, value: dt.datetime) -> str:
        # SQLite has no timestamp type: naive UTC text, the format of the table contract.
        # A UTC time (core.periods.utcnow's, every record's) needs no conversion.
        utc = value if value.tzinfo is dt.timezone.utc else value.astimezone(dt.timezone.utc)
        if type(utc) is dt.datetime and utc.year >= 1000:
            # isoformat is ~3x cheaper than strftime and, for 4-digit years, spells exactly
            # SQLITE_TS_FORMAT ("%Y-%m-%d %H:%M:%S.%f") followed by "+00:00".
            return utc.isoformat(" ", "microseconds")[:26]
        return utc.strftime(SQLITE_TS_FORMAT)

    def seen(self, value: dt.datetime) -> str:
        # One host: this host's clock.
        return self.ts(value)

    # (whole seconds since the epoch, their "YYYY-MM-DD HH:MM:SS"): one formatting per second.
    _second: tuple[int, str] = (-1, "")

    def seen_now(self) -> str:
        return self.ts_of_ns(time.time_ns())

    def ts_of_ns(self, epoch_ns: int) -> str:
        # The UTC fast path of a record's time: no datetime, the seconds' text made once per
        # second, the microseconds appended (floored, as datetime.now does). Exactly `ts`'s text.
        second, us = divmod(epoch_ns // 1000, 1_000_000)
        cached = self._second  # one read: another thread may replace it, never half of it
        if cached[0] != second:
            cached = (second, time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(second)))
            self._second = cached
        return f"{cached[1]}.{us:06d}"

    def insert(self, table: Any) -> Any:
        return sqlite_sql.insert(table)

    def epoch_s(self, col: Any) -> ColumnElement[Any]:
        # Naive UTC text; julianday() reads the fraction too. Only a timestamp as the table
        # contract spells it: julianday('now') is a valid (and always fresh) time, which would
        # make a run never old and never silent.
        return case((col.op("GLOB")(literal(ISO_GLOB, String())), (func.julianday(col) - 2440587.5) * 86400.0))

    def db_now(self, conn: Connection) -> dt.datetime:
        return dt.datetime.now(dt.timezone.utc)

    def integer_sum(self, a: Any, b: Any) -> ColumnElement[Any]:
        # SQLite adds text as 0: a text counter would read as "few tokens".
        return case((and_(func.typeof(a) == "integer", func.typeof(b) == "integer"), a + b))


class PostgresDialect(Dialect):
    name = "postgresql"
    ph = "%s"
    greatest = "GREATEST"
    json_ph = "%s::json"
    # The database server's clock, so that hosts whose clocks disagree never look silent, old
    # or out of the rate window to a daemon; now() is read once per transaction, so an event
    # and its run's last_seen_at stay one reading. A value given explicitly (a benchmark, a
    # replay tool) wins.
    clock_ph = "COALESCE(%s::timestamptz, now())"
    for_update = " FOR UPDATE"
    returning = True
    write_begin = "BEGIN"
    autocommit_writes = True
    modifying_cte = True
    prune_rows_per_batch = 10000
    prune_pause_ratio = 0.1
    reads_fail_in_driver = True

    def read_only_connect_args(self) -> dict[str, Any]:
        # Every transaction read-only, whatever the role may do (the web view's viewer role cannot
        # write anyway; a URL naming another role still cannot).
        return {"options": "-c default_transaction_read_only=on"}

    def seen(self, value: dt.datetime) -> None:
        # None: the server's now() when the transaction runs (a record replayed after an outage
        # is dated by its replay, in order, and GREATEST keeps last_seen_at from going back).
        return None

    def seen_now(self) -> None:
        return None  # the server's clock: nothing to read or format here

    def commit_without_flush(self, conn: Connection, *, session: bool = False) -> None:
        # An fsync per tick (two on the lease's autocommit session) was most of an idle tick.
        conn.exec_driver_sql("SET synchronous_commit TO OFF" if session else "SET LOCAL synchronous_commit TO OFF")

    def has_rows(self, cursor: Any) -> bool:
        # psycopg builds a Column per result column for `description` on every call (~4 us for
        # a record's RETURNING row); the result's status says the same in a tenth of a us.
        result = cursor.pgresult
        return result is not None and result.status == _PGRES_TUPLES_OK

    def read_batch(self, conn: Connection, reads: list[tuple[str, tuple[Any, ...]]]) -> list[list[Any]]:
        # psycopg's pipeline mode: the reads go out together, one round trip where each costs
        # ~0.5 ms on a busy host (the change feed's reads, every tick); psycopg syncs once more
        # after the transaction's BEGIN when this is its first statement. Errors are raised as
        # SQLAlchemy's, as exec_driver_sql would (store_unavailable tells an outage from a bad
        # row by them).
        import psycopg
        from sqlalchemy.exc import DBAPIError

        raw: Any = conn.connection.driver_connection
        if raw is None or not _pipelines():  # pipeline mode needs libpq 14: else the reads in turn
            return super().read_batch(conn, reads)
        try:
            with raw.pipeline():
                cursors = [raw.cursor() for _ in reads]
                for cur, (sql, params) in zip(cursors, reads):
                    cur.execute(sql, params)
            return [cur.fetchall() for cur in cursors]
        except psycopg.Error as exc:
            lost = raw.closed or raw.broken
            if lost:
                conn.invalidate(exc)  # as SQLAlchemy does on a disconnect: never back to the pool
            raise DBAPIError.instance(reads[0][0], None, exc, psycopg.Error, hide_parameters=True,
                                      connection_invalidated=lost, dialect=conn.dialect) from exc

    def transaction_failed(self, conn: Connection) -> bool:
        raw: Any = conn.connection.driver_connection
        return raw is None or raw.info.transaction_status == _PQTRANS_INERROR

    def insert(self, table: Any) -> Any:
        return pg.insert(table)

    def epoch_s(self, col: Any) -> ColumnElement[Any]:
        return cast(extract("epoch", col), Float)

    def db_now(self, conn: Connection) -> dt.datetime:
        from sqlalchemy import text

        value = conn.execute(text("SELECT clock_timestamp()")).scalar_one()
        return value.astimezone(dt.timezone.utc)


@functools.cache
def _pipelines() -> bool:
    import psycopg

    return bool(psycopg.Pipeline.is_supported())


_PGRES_TUPLES_OK = 2  # libpq's ExecStatusType of a statement that returned rows (psycopg.pq.ExecStatus)
_PQTRANS_INERROR = 3  # libpq's PGTransactionStatusType of a failed transaction (psycopg.pq.TransactionStatus)

_BACKENDS: dict[str, type[Dialect]] = {"sqlite": SQLiteDialect, "postgresql": PostgresDialect}


@functools.cache
def for_name(name: str) -> Dialect:
    """The backend of a dialect name ("sqlite", "postgresql")."""
    try:
        return _BACKENDS[name]()
    except KeyError:
        raise ValueError(f"no store backend {name!r}: expected one of {', '.join(_BACKENDS)}") from None


def of(bind: Engine | Connection) -> Dialect:
    """The backend of an engine or a connection."""
    return for_name(bind.dialect.name)


def for_url(url: str) -> Dialect:
    """The backend a store URL names (`sqlite:///runs.db`, `postgresql+psycopg://...`)."""
    from sqlalchemy.engine import make_url

    return for_name(make_url(url).get_backend_name())
