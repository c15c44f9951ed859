"""Engines and the store's connection discipline, per database.

SQLite (WAL, BEGIN IMMEDIATE for writers, deferred snapshots for readers) and
PostgreSQL (psycopg 3, pre-ping, REPEATABLE READ for readers).
"""

from __future__ import annotations

from sqlalchemy import create_engine, event
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.exc import ArgumentError

from watchdog.errors import StoreError

SQLITE_BUSY_TIMEOUT_MS = 30_000


def _sqlite_pragmas(dbapi_conn, _record):
    # Let the driver issue no BEGIN of its own: we emit BEGIN IMMEDIATE ourselves.
    dbapi_conn.isolation_level = None
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA journal_mode=WAL")
    cur.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
    cur.execute("PRAGMA synchronous=NORMAL")
    cur.execute("PRAGMA foreign_keys=ON")
    cur.close()


def _sqlite_begin(conn):
    # A deferred BEGIN that reads then writes fails at once with SQLITE_BUSY_SNAPSHOT,
    # whatever the busy timeout: take the write lock up front. Only connections that
    # promise to read (read_connection) begin deferred, so they never block writers.
    if conn.get_execution_options().get("watchdog_read_only"):
        conn.exec_driver_sql("BEGIN")
    else:
        conn.exec_driver_sql("BEGIN IMMEDIATE")


def read_connection(engine: Engine):
    """A connection for reads only, with one consistent snapshot for all its queries.

    SQLite: a deferred BEGIN, a WAL snapshot that does not take the write lock.
    PostgreSQL: REPEATABLE READ (under READ COMMITTED each query would see new commits).
    """
    conn = engine.connect()
    if engine.dialect.name == "postgresql":
        return conn.execution_options(isolation_level="REPEATABLE READ")
    return conn.execution_options(watchdog_read_only=True)


def _masked(url: str) -> str:
    """An unparsable URL may still carry a password: keep the scheme and the host part only."""
    scheme, sep, rest = url.partition("://")
    if not sep or "@" not in rest:
        return url
    return f"{scheme}://***@{rest.rpartition('@')[2]}"


def normalise_url(url: str) -> str:
    """Accept `postgresql://` as psycopg 3 (the driver we ship), check the URL parses."""
    if not url or not isinstance(url, str):
        raise StoreError("store URL: expected a SQLAlchemy URL such as sqlite:///runs.db, got nothing")
    try:
        parsed = make_url(url)
    except ArgumentError:
        raise StoreError(
            f"store URL {_masked(url)!r}: expected a SQLAlchemy URL such as sqlite:///runs.db "
            "or postgresql+psycopg://user@host/db"
        ) from None
    if parsed.drivername in ("postgresql", "postgres"):
        parsed = parsed.set(drivername="postgresql+psycopg")
    if parsed.get_backend_name() not in ("sqlite", "postgresql"):
        raise StoreError(f"store URL {parsed.render_as_string(hide_password=True)!r}: "
                         "only sqlite and postgresql are supported")
    return parsed.render_as_string(hide_password=False)


def make_engine(url: str, **kw) -> Engine:
    """An engine with the store's connection discipline for either database."""
    url = normalise_url(url)
    if url.startswith("sqlite"):
        kw.setdefault("connect_args", {}).setdefault("timeout", SQLITE_BUSY_TIMEOUT_MS / 1000)
        engine = create_engine(url, **kw)
        event.listen(engine, "connect", _sqlite_pragmas)
        event.listen(engine, "begin", _sqlite_begin)
    else:
        kw.setdefault("pool_pre_ping", True)
        # No server-side prepared statements (psycopg prepares a query after 5 runs): behind
        # PgBouncer in transaction pooling mode the next transaction may land on a server
        # connection that never saw the PREPARE.
        kw.setdefault("connect_args", {}).setdefault("prepare_threshold", None)
        engine = create_engine(url, **kw)
    return engine


def is_sqlite(engine: Engine) -> bool:
    return engine.dialect.name == "sqlite"
