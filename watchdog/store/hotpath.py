"""The SDK's write path: one short transaction per record, on the raw DBAPI connection.

Why not SQLAlchemy Core or the ORM here: on SQLite the write lock is held for
as long as the transaction's Python code runs, so every microsecond of
statement compilation is a microsecond all other agents wait. The SQL below is
rendered once per dialect and executed on a per-thread DBAPI connection.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import sqlite3
import threading

from sqlalchemy.engine import Engine

from watchdog.core.budgets import RUN_BUDGET_KEYS
from watchdog.core.lifecycle import ACTIVE_STATUSES, Circuit
from watchdog.store.schema import SQLITE_TS_FORMAT

# Dialect.ts spells this format with isoformat, which is ~3x faster than strftime.
assert SQLITE_TS_FORMAT == "%Y-%m-%d %H:%M:%S.%f"

# The statuses literal in SQL text, from the lifecycle (never spelled out by hand).
ACTIVE_SQL = ", ".join(f"'{s}'" for s in ACTIVE_STATUSES)

EVENT_COLUMNS = (
    "run_id", "seq", "at", "kind", "tool", "args_hash", "args", "ok", "error_class",
    "error_msg", "duration_s", "model", "tokens_in", "tokens_out", "cost_eur", "progress", "attempt",
    "cached_tokens_in", "reasoning_tokens",
)  # fmt: skip

# The run's own budgets follow its identity, in the registry's order (Run.start passes them so).
RUN_COLUMNS = (
    "id", "agent", "status", "kill_mode", "host", "pid", "pid_create_time", "labels",
    *RUN_BUDGET_KEYS, "started_at", "last_seen_at",
)  # fmt: skip


class Dialect:
    """SQL text and value adaptation for one database."""

    def __init__(self, name: str):
        self.name = name
        sqlite = name == "sqlite"
        ph = "?" if sqlite else "%s"
        self.begin = "BEGIN IMMEDIATE" if sqlite else None
        greatest = "MAX" if sqlite else "GREATEST"
        json_ph = ph if sqlite else "%s::json"
        ev_values = ", ".join(json_ph if c == "args" else ph for c in EVENT_COLUMNS)
        self.insert_event = f"INSERT INTO events ({', '.join(EVENT_COLUMNS)}) VALUES ({ev_values})"
        run_values = ", ".join(json_ph if c == "labels" else ph for c in RUN_COLUMNS)
        self.insert_run = f"INSERT INTO runs ({', '.join(RUN_COLUMNS)}) VALUES ({run_values})"
        self.returning = not sqlite or sqlite3.sqlite_version_info >= (3, 35)
        self.update_run = (
            f"UPDATE runs SET steps = steps + {ph}, tool_calls = tool_calls + {ph}, "
            f"tool_errors = tool_errors + {ph}, tokens_in = tokens_in + {ph}, "
            f"tokens_out = tokens_out + {ph}, cost_eur = cost_eur + {ph}, "
            f"cached_tokens_in = cached_tokens_in + {ph}, reasoning_tokens = reasoning_tokens + {ph}, "
            f"cost_unpriced_tokens = cost_unpriced_tokens + {ph}, "
            f"last_seq = {greatest}(last_seq, {ph}), last_seen_at = {greatest}(last_seen_at, {ph}), "
            f"progress = COALESCE({ph}, progress) WHERE id = {ph}"
        )
        if self.returning:
            self.update_run += " RETURNING status, stop_reason, stop_detail"
        self.select_status = f"SELECT status, stop_reason, stop_detail FROM runs WHERE id = {ph}"
        self.end_run = (
            f"UPDATE runs SET status = {ph}, ended_at = {ph}, "
            f"stop_reason = COALESCE(stop_reason, {ph}), stop_detail = COALESCE(stop_detail, {ph}) "
            f"WHERE id = {ph} AND status IN ({ACTIVE_SQL})"
        )
        # A note for humans on a run whose tool has not answered yet (watchdog.sdk.inflight).
        self.set_progress = f"UPDATE runs SET progress = {ph} WHERE id = {ph} AND status IN ({ACTIVE_SQL})"
        # The SDK's cached view of the circuits the daemon opened (watchdog.sdk.circuitview).
        self.select_circuits = (
            "SELECT tool, state, open_until, errors_in_window, window_s, last_error, probe_run_id "
            f"FROM tool_circuits WHERE state <> '{Circuit.CLOSED}'"
        )
        self.select_settings = f"SELECT value FROM settings WHERE key = {ph}"
        self.sqlite = sqlite

    def ts(self, value: dt.datetime):
        # SQLite has no timestamp type: naive UTC text, the format of the table contract.
        if not self.sqlite:
            return value
        utc = value.astimezone(dt.timezone.utc)
        if type(utc) is dt.datetime and utc.year >= 1000:
            # isoformat is ~3x cheaper than strftime and, for 4-digit years, spells exactly
            # SQLITE_TS_FORMAT ("%Y-%m-%d %H:%M:%S.%f") followed by "+00:00".
            return utc.isoformat(" ", "microseconds")[:26]
        return utc.strftime(SQLITE_TS_FORMAT)

    def json(self, value):
        return None if value is None else json.dumps(value, sort_keys=True, default=str)

    def parse_ts(self, value):
        if value is None:
            return None
        if isinstance(value, str):
            value = dt.datetime.fromisoformat(value)
        if value.tzinfo is None:
            value = value.replace(tzinfo=dt.timezone.utc)
        return value

    def parse_json(self, value):
        return json.loads(value) if isinstance(value, str) else value


class Writer:
    """Runs short transactions on one DBAPI connection per thread."""

    def __init__(self, engine: Engine):
        self.engine = engine
        self.dialect = Dialect(engine.dialect.name)
        self._local = threading.local()
        self._pid = os.getpid()
        self._parents: list = []

    def _conn(self):
        if self._pid != os.getpid():
            self._after_fork()
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = self.engine.raw_connection()
            self._local.conn = conn
        return conn

    def _after_fork(self):
        # A forked child (multiprocessing) inherits the parent's connections: a shared
        # socket or SQLite handle corrupts both processes' transactions. The child opens
        # its own. The parent's are kept referenced, never used nor closed here: closing
        # (or garbage-collecting) them would end the parent's sessions.
        self._parents.append(self._local)
        self._local = threading.local()
        self.engine.dispose(close=False)
        self._pid = os.getpid()

    def transaction(self, statements):
        """Execute [(sql, params), ...] in one transaction; return the last statement's first row."""
        conn = self._conn()
        cur = None
        row = None
        try:
            cur = conn.cursor()
            if self.dialect.begin:
                cur.execute(self.dialect.begin)
            for sql, params in statements:
                cur.execute(sql, params)
                row = cur.fetchone() if cur.description else None
            if self.dialect.sqlite:
                cur.execute("COMMIT")
            else:
                conn.commit()
            cur.close()
            return row
        except BaseException:
            self._abort(conn, cur)
            raise

    def query(self, sql, params=()):
        """A read outside any write transaction (no write lock taken on SQLite)."""
        conn = self._conn()
        cur = None
        try:
            cur = conn.cursor()
            cur.execute(sql, params)
            rows = cur.fetchall()
            cur.close()
            if not self.dialect.sqlite:
                conn.rollback()  # end the implicit read transaction: never sit idle in one
            return rows
        except BaseException:
            self._abort(conn, cur)
            raise

    def _abort(self, conn, cur):
        # Roll back explicitly before dropping the connection. Closing a sqlite3
        # connection while a cursor of the failed statement is still referenced
        # (by the traceback being raised) leaves a "zombie" connection that keeps
        # the transaction, and with it the database's write lock, until garbage
        # collection: every other agent would then wait out its busy timeout.
        for step in (lambda: cur.close() if cur is not None else None, conn.rollback):
            try:
                step()
            except Exception:  # a broken connection cannot be rolled back: it is discarded below
                pass
        self.discard()

    def is_rejection(self, exc: BaseException) -> bool:
        """True when the store refused this record itself (constraint, bad data),
        False for a store that is down, locked or unreachable. Retrying a refused
        record can never succeed, so it must not be buffered."""
        exc = getattr(exc, "orig", None) or exc  # SQLAlchemy wraps connect-time errors
        dbapi = self.engine.dialect.loaded_dbapi
        kinds = tuple(getattr(dbapi, name) for name in ("IntegrityError", "DataError", "ProgrammingError",
                                                         "NotSupportedError") if hasattr(dbapi, name))
        return isinstance(exc, kinds)

    def is_conflict(self, exc: BaseException) -> bool:
        """True for an integrity error: a duplicate key or a missing parent row."""
        exc = getattr(exc, "orig", None) or exc
        return isinstance(exc, self.engine.dialect.loaded_dbapi.IntegrityError)

    def discard(self):
        """Drop this thread's connection after an error: the next use reconnects."""
        if self._pid != os.getpid():
            self._after_fork()  # never close the parent's connection from a child
        conn = getattr(self._local, "conn", None)
        self._local.conn = None
        if conn is not None:
            try:
                conn.invalidate()
            except Exception:  # a connection that is already broken cannot be closed cleanly
                pass
