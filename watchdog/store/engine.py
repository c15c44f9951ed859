"""Engines and the store's connection discipline, per database.

SQLite (WAL, BEGIN IMMEDIATE for writers, deferred snapshots for readers) and
PostgreSQL (psycopg 3, pre-ping, REPEATABLE READ for readers).
"""

from __future__ import annotations

import functools
import os
import stat
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from sqlalchemy import create_engine, event
# Engine and Connection are re-exported: the type of an engine and a connection on the sides that
# never import SQLAlchemy (the CLI, the web view, the demo, the gateways, the SDK).
from sqlalchemy.engine import Connection as Connection, Engine as Engine, make_url
from sqlalchemy.exc import ArgumentError, DBAPIError, DisconnectionError, InterfaceError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeoutError

from watchdog.core.text import url_without_password
from watchdog.errors import StoreError, StoreMisconfigured

if TYPE_CHECKING:
    import sqlite3

    from sqlalchemy.pool import ConnectionPoolEntry

SQLITE_BUSY_TIMEOUT_MS = 30_000
# PostgreSQL: how long one of the daemon's statements may wait for a row lock (the tick's stop
# requests, the ladder's FOR UPDATE, the foreign-key share lock of an audit or alert row): an
# agent's login may lock its own run row and leave its transaction idle, so an unbounded wait
# would stall the tick for every run. Far above an agent's own short record transactions, far
# under one tick (tick_s, 5 s by default): a tick meets at most one such wait per locked run (its
# step is rolled back to its SAVEPOINT at the first), and the run is tried again at the next tick.
DAEMON_LOCK_TIMEOUT_MS = 250
# SQLSTATE 55P03, lock_not_available: raised by lock_timeout (and NOWAIT).
LOCK_NOT_AVAILABLE = "55P03"


def _lenient_text(raw: bytes) -> str:
    return raw.decode("utf-8", "replace")


def _sqlite_pragmas(dbapi_conn: sqlite3.Connection, _record: ConnectionPoolEntry, read_only: bool = False) -> None:
    # Let the driver issue no BEGIN of its own: we emit BEGIN IMMEDIATE ourselves.
    dbapi_conn.isolation_level = None
    # SQLite stores whatever bytes a writer hands it as TEXT; the driver's own decoding fails
    # the WHOLE query on one invalid UTF-8 value ("Could not decode to UTF-8 column"), and it
    # says so as an OperationalError, like a store that is down. One bad row must cost only
    # itself: decode with replacement characters (the tick reports such a row, see scan.py).
    dbapi_conn.text_factory = _lenient_text
    cur = dbapi_conn.cursor()
    if not read_only:  # setting the journal mode is a write; the file's WAL mode persists anyway
        cur.execute("PRAGMA journal_mode=WAL")
    cur.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
    cur.execute("PRAGMA synchronous=NORMAL")
    cur.execute("PRAGMA foreign_keys=ON")
    cur.close()


def _pg_checkout(dbapi_conn: Any, _record: ConnectionPoolEntry, _proxy: Any) -> None:
    """A pooled PostgreSQL connection is alive unless its socket has something to say: an idle
    session receives nothing until it sends a query, so a readable socket means the server ended
    it (a restart, pg_terminate_backend, a crash's EOF). The pool then opens a new one. This
    replaces `pool_pre_ping`'s SELECT 1, a round trip per checkout (several per tick); a silent
    network loss is caught by the query itself, whose error invalidates the pool all the same
    (the daemon retries the tick; the SDK keeps the ping: an agent's call should not fail on it)."""
    import select

    try:
        if dbapi_conn.closed or dbapi_conn.broken:
            raise DisconnectionError("the connection is closed")
        # poll, never select(): select refuses a descriptor >= 1024, and a daemon holding a pidfd
        # per local run has its sockets up there (every checkout would be refused).
        poller = select.poll()
        poller.register(dbapi_conn.fileno(), select.POLLIN | select.POLLPRI)
        readable = poller.poll(0)  # errors and hang-ups are always reported
    except DisconnectionError:
        raise
    except Exception as exc:  # noqa: BLE001 — no usable socket: a new connection, never an error
        raise DisconnectionError(f"the connection's socket cannot be polled ({type(exc).__name__})") from exc
    if readable:
        raise DisconnectionError("the server sent something to an idle connection: it ended the session")


def _sqlite_begin(conn: Connection) -> None:
    # A deferred BEGIN that reads then writes fails at once with SQLITE_BUSY_SNAPSHOT,
    # whatever the busy timeout: take the write lock up front. Only connections that
    # promise to read (read_connection) begin deferred, so they never block writers.
    if conn.get_execution_options().get("watchdog_read_only"):
        conn.exec_driver_sql("BEGIN")
    else:
        conn.exec_driver_sql("BEGIN IMMEDIATE")


# PostgreSQL: how long a gateway's statement (the LiteLLM callback, the MCP proxy) may wait for a
# lock. Any login may insert a run under an id it picks and leave the transaction open; a gateway
# that then makes its own run of that id (a trace id) would wait for ever, its thread stuck, and
# enough stuck threads make every other call's check miss its deadline and fail open. Under the
# callback's pre-call deadline (2 s) and the proxy's (5 s): the wait raises lock_not_available,
# and the gateway refuses that one call.
GATEWAY_LOCK_TIMEOUT_MS = 500


def _pg_lock_timeout(conn: Connection, ms: int) -> None:
    """Each transaction's first statement (the engine's `begin` event): `SET LOCAL`, so that the
    bound holds behind PgBouncer's transaction pooling too, where a session's SET stays on the one
    server connection that ran it (the Writer's raw connections send theirs with BEGIN)."""
    dbapi: Any = conn.connection.dbapi_connection
    cur = dbapi.cursor()  # the driver's: it begins the transaction implicitly
    try:
        cur.execute(f"SET LOCAL lock_timeout = '{ms}ms'")
    finally:
        cur.close()


def bound_lock_waits(conn: Connection) -> None:
    """PostgreSQL: the rest of the caller's transaction waits at most DAEMON_LOCK_TIMEOUT_MS for
    any one lock (`SET LOCAL`: it ends with the transaction, so it holds behind PgBouncer's
    transaction pooling too, and a SAVEPOINT's rollback after it keeps it). A wait past it raises
    lock_not_available (row_locked() says so). The daemon's transactions call it first; SQLite
    needs none (its writers wait busy_timeout for the one file lock, then fail)."""
    if conn.dialect.name == "postgresql":
        conn.exec_driver_sql(f"SET LOCAL lock_timeout = '{int(DAEMON_LOCK_TIMEOUT_MS)}ms'")


def row_locked(exc: BaseException) -> bool:
    """A statement gave up waiting for a lock another session holds (lock_timeout): one run's
    row is held by a writer, the store is not down; the caller passes over that run only."""
    # SQLAlchemy's error carries the driver's as .orig; a statement sent on the raw driver's
    # cursor (the bulk event inserts) raises the driver's own.
    return LOCK_NOT_AVAILABLE in (_sqlstate(exc), getattr(exc, "sqlstate", None))


def store_unavailable(exc: BaseException) -> bool:
    """The store is down, unreachable or locked (as opposed to one row being bad): the
    caller retries everything later instead of passing over a row. A PostgreSQL row lock that
    timed out (row_locked) is one row's, not the store's."""
    if isinstance(exc, DBAPIError) and exc.connection_invalidated:
        return True
    if row_locked(exc):
        return False
    if isinstance(exc, OperationalError) and _sqlstate(exc)[:2] in NOT_OUTAGE_CLASSES:
        return False  # the server refused this statement for what it read: the rows decide, not the store
    return isinstance(exc, (OperationalError, InterfaceError, PoolTimeoutError))


# SQLSTATE classes the drivers raise as OperationalError that say nothing of the store being down:
# 54, a program limit exceeded (a row past 1 GB: a writer's text, "out of memory" to the reader).
NOT_OUTAGE_CLASSES = frozenset({"54"})


def _sqlstate(exc: BaseException) -> str:
    code = getattr(getattr(exc, "orig", None), "sqlstate", None)
    return code if isinstance(code, str) else ""


def read_connection(engine: Engine) -> Connection:
    """A connection for reads only, with one consistent snapshot for all its queries.

    SQLite: a deferred BEGIN, a WAL snapshot that does not take the write lock.
    PostgreSQL: REPEATABLE READ (under READ COMMITTED each query would see new commits).
    """
    conn = engine.connect()
    if engine.dialect.name == "postgresql":
        return conn.execution_options(isolation_level="REPEATABLE READ")
    return conn.execution_options(watchdog_read_only=True)


def statement_reads(engine: Engine) -> Connection:
    """A connection for reads that need no snapshot across statements (each is consistent on its
    own). PostgreSQL: autocommit, so no BEGIN and no ROLLBACK round trips around them; SQLite:
    read_connection (its BEGIN costs nothing over a socket)."""
    if engine.dialect.name == "postgresql":
        return engine.connect().execution_options(isolation_level="AUTOCOMMIT")
    return read_connection(engine)


def normalise_url(url: str) -> str:
    """Accept `postgresql://` as psycopg 3 (the driver we ship), check the URL parses."""
    if not url or not isinstance(url, str):
        raise StoreError("store URL: expected a SQLAlchemy URL such as sqlite:///runs.db, got nothing")
    try:
        parsed = make_url(url)
    except ArgumentError:
        raise StoreError(
            f"store URL {url_without_password(url)!r}: expected a SQLAlchemy URL such as sqlite:///runs.db "
            "or postgresql+psycopg://user@host/db"
        ) from None
    if parsed.drivername in ("postgresql", "postgres"):
        parsed = parsed.set(drivername="postgresql+psycopg")
    if parsed.get_backend_name() not in ("sqlite", "postgresql"):
        raise StoreError(f"store URL {parsed.render_as_string(hide_password=True)!r}: "
                         "only sqlite and postgresql are supported")
    return parsed.render_as_string(hide_password=False)


EXTRA_HINT = "pip install 'agent-watchdog-daemon[{extra}]', or '.[{extra}]' from a checkout"


def _require_driver(url: str) -> None:
    """A PostgreSQL URL without psycopg installed: say which extra brings it (not ModuleNotFoundError)."""
    import importlib.util

    try:
        missing = importlib.util.find_spec("psycopg") is None
    except (ImportError, ValueError):
        missing = True
    if missing:
        raise StoreError(f"store URL {url_without_password(url)!r} needs the `postgres` extra (psycopg 3): "
                         + EXTRA_HINT.format(extra="postgres"))


def make_engine(url: str, *, read_only: bool = False, must_exist: bool = False, create: bool = True,
                lock_timeout_ms: int | None = None, **kw: Any) -> Engine:
    """An engine with the store's connection discipline for either database.

    `must_exist`: a SQLite file that is not there is a StoreError naming the fix, instead
    of an empty file created by the first connection. `create=False` (the SDK): the file is
    opened read-write but never created, so the first contact fails with the fix instead. `read_only` (implies must_exist):
    SQLite opens the file read-only (`mode=ro`), so a read can never create or change it.
    `lock_timeout_ms` (PostgreSQL): each transaction's `lock_timeout`, for a process that must never
    wait long on a row another login holds (the gateways: see GATEWAY_LOCK_TIMEOUT_MS).
    """
    url = normalise_url(url)
    # A failed statement's message never carries its values (error texts, arguments, labels):
    # exceptions are logged, and what they would quote is exactly what must stay in the store.
    kw.setdefault("hide_parameters", True)
    if not url.startswith("sqlite"):
        _require_driver(url)
        # No server-side prepared statements (psycopg prepares a query after 5 runs): behind
        # PgBouncer in transaction pooling mode the next transaction may land on a server
        # connection that never saw the PREPARE.
        kw.setdefault("connect_args", {}).setdefault("prepare_threshold", None)
        pg_engine = create_engine(url, **kw)
        if lock_timeout_ms is not None:
            event.listen(pg_engine, "begin", functools.partial(_pg_lock_timeout, ms=int(lock_timeout_ms)))
        if not kw.get("pool_pre_ping"):  # a caller asking for the ping gets it; ours costs no round trip
            event.listen(pg_engine, "checkout", _pg_checkout)
        return pg_engine
    path = sqlite_path(url)
    if (must_exist or read_only) and path is not None and not os.path.exists(path):
        raise StoreError(f"no store at {path}: create it with `agent-watchdog db upgrade --db {url}`, "
                         "or check --db / $AGENT_WATCHDOG_DB / [store] url")
    if read_only and path is not None:
        url = f"sqlite:///file:{quote(os.path.abspath(path))}?mode=ro&uri=true"
    elif not create and path is not None:
        # Opened read-write, never created: a mistyped path must not leave an empty file behind
        # (the first write says "no store at PATH", see misconfiguration()).
        url = f"sqlite:///file:{quote(os.path.abspath(path))}?mode=rw&uri=true"
    kw.setdefault("connect_args", {}).setdefault("timeout", SQLITE_BUSY_TIMEOUT_MS / 1000)
    engine = create_engine(url, **kw)
    event.listen(engine, "connect", functools.partial(_sqlite_pragmas, read_only=read_only))
    event.listen(engine, "begin", _sqlite_begin)
    return engine


def sqlite_path(url: str) -> str | None:
    """The file of a SQLite URL; None for an in-memory database."""
    database = make_url(url).database
    return None if not database or database == ":memory:" or database.startswith("file:") else database


# The SQLite store's files, as the agents' group shares them: read-write for the owner and
# the group (the agents), nothing for others. SQLite's own creation mode is 0644 minus the
# umask: under the unit's UMask=0007 that is 0640, and every agent's first write fails.
SQLITE_SHARED_MODE = 0o660


def sqlite_files(path: str) -> tuple[str, str, str]:
    return path, f"{path}-wal", f"{path}-shm"


def existing_files(url: str) -> set[str]:
    """The store's files that exist now (call before creating the store)."""
    path = sqlite_path(url) if url.startswith("sqlite") else None
    return {f for f in sqlite_files(path) if os.path.lexists(f)} if path else set()


def share_sqlite_files(url: str, before: set[str] | None = None) -> list[str]:
    """chmod 0660 the SQLite store's file and its -wal and -shm files: those this process
    created (absent from `before`) or owns, never a symlink, never another user's file and
    never wider than 0660. Returns the files changed. No-op for PostgreSQL."""
    path = sqlite_path(url) if url.startswith("sqlite") else None
    changed = []
    for f in sqlite_files(path) if path else ():
        try:
            st = os.lstat(f)
        except FileNotFoundError:
            continue
        ours = st.st_uid == os.geteuid()
        if not stat.S_ISREG(st.st_mode) or not (ours or (before is not None and f not in before)):
            continue
        if stat.S_IMODE(st.st_mode) != SQLITE_SHARED_MODE:
            try:
                os.chmod(f, SQLITE_SHARED_MODE, follow_symlinks=False)
            except (PermissionError, NotImplementedError):
                continue  # not ours to change after all: the agents' first write says so (misconfiguration)
            changed.append(f)
    return changed


def upgrade_hint(url: str) -> str:
    return f"run `agent-watchdog db upgrade --db {url_without_password(url)}` first"


def require_tables(engine: Engine, url: str) -> None:
    """StoreError naming the fix when the store has no tables yet (never migrated).

    One cheap query (no Alembic import): commands call it before their first read, so
    "no such table: settings" never reaches a user."""
    from sqlalchemy import text
    from sqlalchemy.exc import DBAPIError

    try:
        with engine.connect() as conn:
            conn.execute(text("SELECT version_num FROM alembic_version")).first()
    except DBAPIError as exc:
        orig = getattr(exc, "orig", None) or exc
        if getattr(orig, "sqlstate", None) == "42501" or "permission denied" in str(orig).lower():
            raise StoreError(read_refused(url)) from None  # issue 36: an agent's own login, say what reads
        if not is_missing_schema(exc):
            raise
        raise StoreError(f"the store at {url_without_password(url)} has no tables: {upgrade_hint(url)}") from None


def read_refused(url: str) -> str:
    """One line for a login that may not read the store's tables (an agent's or a gateway's role)."""
    from sqlalchemy.engine import make_url

    try:
        login = make_url(url).username
    except Exception:  # noqa: BLE001 — only a name for the message
        login = None
    who = f"login {login!r}" if login else "this login"
    return (f"the store at {url_without_password(url)} does not let {who} read its tables (an agent's role may only "
            "write its own runs): read with the daemon's login or a viewer role, e.g. `GRANT agent_watchdog_viewer "
            f"TO {login or 'LOGIN'};` (sql/postgres-roles.sql)")


def is_missing_schema(exc: BaseException) -> bool:
    """A query failed because a table or column is missing: the store is older than this code."""
    orig = getattr(exc, "orig", exc)
    text = str(orig).lower()
    if type(orig).__name__ in ("UndefinedTable", "UndefinedColumn"):  # psycopg
        return True
    return "no such table" in text or "no such column" in text


# What a gateway's login (the LiteLLM callback, the MCP proxy) is granted on PostgreSQL.
GATEWAY_ROLE = "the gateway's role (agent_watchdog_gateway)"


def misconfiguration(exc: BaseException, url: str, *, role: str = "the agents' role") -> str | None:
    """One line naming the store (password masked) and the fix when `exc` says the store is
    reachable but unusable by this process: never migrated, read-only for it (SQLite file or
    directory permissions; a PostgreSQL role without the grant), or refusing the credentials.
    None for everything else: a store that is down, refuses connections or is locked is an
    outage (the SDK buffers through it); a record it refuses is dropped (Writer.is_rejection).
    `role`: what the fix grants (a gateway's login needs the gateway's role, not the agents')."""
    orig = getattr(exc, "orig", None) or exc
    first = (str(orig).strip().splitlines() or [""])[0]
    text = first.lower()
    sqlstate = getattr(orig, "sqlstate", None)
    shown = url_without_password(url)
    path = sqlite_path(url) if url.startswith("sqlite") else None
    if path is not None and _missing(path):
        return f"no store at {path}: create it with `agent-watchdog db upgrade --db {url}`, or check the URL"
    if is_missing_schema(exc):
        return f"the store at {shown} has no tables: {upgrade_hint(url)}"
    if "readonly database" in text or "unable to open database file" in text:
        who = _whoami()
        return (f"the store at {shown} cannot be written by this process (user {who}: {first[:80]}): add {who} to "
                f"the store's group "
                f"and make the file and its -wal and -shm files group-writable (chmod 0660; `agent-watchdog db "
                f"upgrade` does) in a setgid directory (docs/howto/systemd.md, \"Operator setup\")")
    if sqlstate == "42501" or "permission denied" in text:
        return (f"the store at {shown} refuses this role's writes ({first[:160]}): grant it {role} "
                "(sql/postgres-roles.sql, docs/howto/several-hosts.md, \"The database roles\"), after each "
                "`agent-watchdog db upgrade`")
    if (sqlstate in ("28P01", "28000") or "password authentication failed" in text
            or ("role" in text and "does not exist" in text)):
        return (f"the store at {shown} refuses the credentials ({_fatal(first)}): fix the user or password in "
                "the URL ($AGENT_WATCHDOG_DB, or ~/.pgpass)")
    if "database" in text and "does not exist" in text:
        return (f"the store at {shown} does not exist ({_fatal(first)}): create the database, then "
                f"{upgrade_hint(url)}")
    return None


def gateway_misconfiguration(exc: BaseException, url: str | None) -> str | None:
    """misconfiguration() for a gateway's login: the fix when `exc` (a driver's error, or the
    SDK's StoreMisconfigured, already worded) says its store refuses it; None for an outage."""
    if isinstance(exc, StoreMisconfigured):  # the SDK's, worded with the Watchdog's store_role
        return str(exc).removeprefix("agent-watchdog: ")
    return misconfiguration(exc, url or "", role=GATEWAY_ROLE)


def _missing(path: str) -> bool:
    """The file is not there (as opposed to there but out of this user's reach)."""
    try:
        os.stat(path)
    except FileNotFoundError:
        return True
    except OSError:  # permission denied on the way: it may well exist
        return False
    return False


def _fatal(line: str) -> str:
    """`FATAL:  role "x" does not exist` out of libpq's "connection to server ... failed: FATAL: ..." line."""
    return line.rsplit("FATAL:", 1)[-1].strip()[:160] if "FATAL:" in line else line[:160]


def _whoami() -> str:
    import pwd

    try:
        return pwd.getpwuid(os.geteuid()).pw_name
    except KeyError:
        return f"uid {os.geteuid()}"
