"""The SDK's write path: one short transaction per record, on a raw DBAPI connection of a small pool.

Why not SQLAlchemy Core or the ORM here: on SQLite the write lock is held for
as long as the transaction's Python code runs, so every microsecond of
statement compilation is a microsecond all other agents wait. The SQL below is
rendered once per dialect and executed on a DBAPI connection taken from the
process's small pool for that one transaction.
"""

from __future__ import annotations

import functools
import os
import threading
import time
import weakref
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from sqlalchemy.engine import Engine
from sqlalchemy.exc import TimeoutError as PoolTimeoutError

from watchdog.core.budgets import RUN_BUDGET_KEYS
from watchdog.core import lifecycle as lc
from watchdog.core.lifecycle import ACTIVE_STATUSES, Circuit
from watchdog.store import dialects
from watchdog.store.dialects import Dialect

# Connections per process (per Watchdog): agents' threads share them. Through PgBouncer
# (transaction pooling) 1,000 agent processes need only its pool of server connections.
POOL_SIZE = 2
# A thread that finds every connection busy this long gives up (the SDK buffers the record).
POOL_WAIT_S = 10.0

Statement = tuple[str, Sequence[Any]]  # (SQL, its parameters), as watchdog.store.lineage spells it

# The statuses literal in SQL text, from the lifecycle (never spelled out by hand).
ACTIVE_SQL = ", ".join(f"'{s}'" for s in ACTIVE_STATUSES)

EVENT_COLUMNS = (
    "run_id", "seq", "at", "kind", "tool", "args_hash", "args", "ok", "error_class",
    "error_msg", "duration_s", "model", "tokens_in", "tokens_out", "cost_eur", "progress", "attempt",
    "cached_tokens_in", "reasoning_tokens",
    "mac",  # the run's attested process's MAC of the record (watchdog.core.evidence_mac), or NULL
)  # fmt: skip

# How a run ends itself (AgentSQL.end): it left its block, failed, or obeyed a stop. Never `lost`:
# that is the daemon's verdict on a run whose process is gone, not something a live run says.
END_STATUSES = (lc.COMPLETED, lc.FAILED, lc.KILLED)

# The run's own budgets follow its identity, in the registry's order (Run.start passes them so).
RUN_COLUMNS = (
    "id", "agent", "status", "kill_mode", "host", "pid", "pid_create_time", "labels",
    *RUN_BUDGET_KEYS, "started_at", "last_seen_at", "source",
)  # fmt: skip


class AgentSQL:
    """The SDK's statements for one backend, rendered once (see the module's docstring)."""

    def __init__(self, backend: Dialect) -> None:
        self.backend = backend
        ph, clock = backend.ph, backend.clock_ph
        greatest, json_ph = backend.greatest, backend.json_ph
        ev_values = ", ".join(json_ph if c == "args" else clock if c == "at" else ph for c in EVENT_COLUMNS)
        self.insert_event = f"INSERT INTO events ({', '.join(EVENT_COLUMNS)}) VALUES ({ev_values})"
        run_values = ", ".join(json_ph if c == "labels" else clock if c in ("started_at", "last_seen_at")
                               else ph for c in RUN_COLUMNS)
        self.insert_run = f"INSERT INTO runs ({', '.join(RUN_COLUMNS)}) VALUES ({run_values})"
        self.update_run = (
            f"UPDATE runs SET steps = steps + {ph}, tool_calls = tool_calls + {ph}, "
            f"tool_errors = tool_errors + {ph}, tokens_in = tokens_in + {ph}, "
            f"tokens_out = tokens_out + {ph}, cost_eur = cost_eur + {ph}, "
            f"cached_tokens_in = cached_tokens_in + {ph}, reasoning_tokens = reasoning_tokens + {ph}, "
            f"cost_unpriced_tokens = cost_unpriced_tokens + {ph}, "
            f"last_seq = {greatest}(last_seq, {ph}), last_seen_at = {greatest}(last_seen_at, {clock}), "
            f"progress = COALESCE({ph}, progress) WHERE id = {ph}"
        )
        if backend.returning:
            self.update_run += " RETURNING status, stop_reason, stop_detail"
        # A record as one statement where the backend can (PostgreSQL: a data-modifying WITH, one
        # round trip in autocommit). Row-level security, the checks and the triggers apply to both
        # writes exactly as to two statements; the run's status comes back by RETURNING.
        self.record_one: str | None = None
        if backend.modifying_cte and backend.returning:
            self.record_one = f"WITH ev AS ({self.insert_event}) {self.update_run}"
        self.select_status = f"SELECT status, stop_reason, stop_detail FROM runs WHERE id = {ph}"
        # Its status is a parameter, one of END_STATUSES, from any active status: every such move is
        # checked against lifecycle.STATUS_MOVES here, once per backend, not on each run's end.
        for current in ACTIVE_STATUSES:
            for end in END_STATUSES:
                lc.check_status_move(current, end)
        self.end_run = (
            f"UPDATE runs SET status = {ph}, ended_at = {clock}, "
            f"stop_reason = COALESCE(stop_reason, {ph}), stop_detail = COALESCE(stop_detail, {ph}) "
            f"WHERE id = {ph} AND status IN ({ACTIVE_SQL})"
        )
        # A note for humans on a run whose tool has not answered yet (watchdog.sdk.inflight).
        self.set_progress = f"UPDATE runs SET progress = {ph} WHERE id = {ph} AND status IN ({ACTIVE_SQL})"
        # The SDK's cached view of the circuits the daemon opened (watchdog.sdk.circuits).
        # A circuit whose probe claim is marked ok counts as closed; never the error's text, only its class.
        self.select_circuits = (
            "SELECT c.tool, c.state, c.open_until, c.errors_in_window, c.window_s, c.last_error_class, "
            "COALESCE(c.probe_run_id, p.run_id) FROM tool_circuits c LEFT JOIN circuit_probes p "
            "ON p.tool = c.tool AND p.opened_at = c.opened_at "
            f"WHERE c.state <> '{Circuit.CLOSED}' AND (p.ok IS NULL OR NOT p.ok)"
        )
        self.select_settings = f"SELECT value FROM settings WHERE key = {ph}"
        # The MAC of a record written before the run was attested (its key came later).
        self.mac_event = f"UPDATE events SET mac = {ph} WHERE run_id = {ph} AND seq = {ph} AND mac IS NULL"


    def end(self, run_id: str, status: str, at: Any, reason: str | None, detail: str | None) -> Statement:
        """The run ends itself (`at`: Dialect.seen): only as one of END_STATUSES, the moves end_run
        was checked for; any other status is the caller's bug and raises IllegalStatusMove."""
        if status not in END_STATUSES:
            raise lc.IllegalStatusMove(lc.RUNNING, status)
        return self.end_run, (status, at, reason, detail, run_id)

    def record(self, event: Sequence[Any], update: Sequence[Any]) -> list[Statement]:
        """A record's writes: the event (EVENT_COLUMNS) and its run's counters (update_run's
        parameters), whose last statement reads the run's status back where RETURNING exists."""
        if self.record_one is not None:
            return [(self.record_one, (*event, *update))]
        return [(self.insert_event, event), (self.update_run, update)]


@functools.cache
def _agent_sql(name: str) -> AgentSQL:
    return AgentSQL(dialects.for_name(name))


# A pooled connection with the one cursor every transaction on it reuses (a cursor per record
# is setup the raw driver does not pay).
_Slot = tuple[Any, Any]


class Writer:
    """Runs short transactions on a small pool of DBAPI connections shared by the process's threads.

    At most `pool_size` connections, whatever the number of threads: each transaction takes
    one, the threads beyond wait their turn (a record is one short transaction, so the wait
    is short). Through PgBouncer in transaction pooling mode nothing here keeps session
    state: no SET, no advisory lock, no server-side prepared statement (see make_engine).

    PostgreSQL connections are in autocommit: a statement alone is its own transaction, so a
    record (one statement there, `AgentSQL.record`) costs one round trip; several statements
    are wrapped in BEGIN / COMMIT. SQLite takes the write lock up front (BEGIN IMMEDIATE),
    where the busy timeout waits for it, never mid-transaction where it cannot.
    """

    def __init__(self, engine: Engine, pool_size: int = POOL_SIZE, lock_timeout_ms: int | None = None):
        """`lock_timeout_ms` (PostgreSQL; the gateways): every transaction's lock waits are
        bounded by `SET LOCAL`, sent with its BEGIN (one round trip), so the bound holds behind
        PgBouncer's transaction pooling too, where a session's SET stays on whichever server
        connection ran it: its single statements are then transactions of their own too."""
        if isinstance(pool_size, bool) or not isinstance(pool_size, int) or pool_size < 1:
            raise ValueError(f"pool_size: expected an integer >= 1, got {pool_size!r}")
        self.engine = engine
        self.dialect = dialects.of(engine)  # the backend: placeholders, the clock, timestamps
        self.sql = _agent_sql(self.dialect.name)  # the SDK's statements, rendered once per backend
        self.pool_size = pool_size
        self._begin = self.dialect.write_begin
        self._autocommit = self.dialect.autocommit_writes  # the connections' mode
        self._one_trip = self._autocommit  # a single statement is its own transaction (autocommit)
        if lock_timeout_ms is not None and self.dialect.name == "postgresql":
            self._begin = f"{self._begin}; SET LOCAL lock_timeout = '{int(lock_timeout_ms)}ms'"
            self._one_trip = False
        self._idle: list[_Slot] = []  # LIFO: the warmest connection first; list.pop/append are atomic
        self._open = 0  # connections this process opened and has not dropped (idle or in use)
        self._cond = threading.Condition(threading.Lock())
        self._parents: list[list[_Slot]] = []
        _WRITERS.add(self)

    # -- the pool ---------------------------------------------------------------------

    def _take(self) -> _Slot:
        try:
            return self._idle.pop()  # the hot path: no lock
        except IndexError:
            return self._take_slow()

    def _take_slow(self) -> _Slot:
        deadline = None
        with self._cond:
            while True:
                if self._idle:
                    return self._idle.pop()
                if self._open < self.pool_size:
                    self._open += 1
                    break
                now = time.monotonic()
                deadline = deadline or now + POOL_WAIT_S
                if now >= deadline:
                    raise PoolTimeoutError(f"all {self.pool_size} store connections of this process stayed busy "
                                           f"for {POOL_WAIT_S:g} s")
                self._cond.wait(min(deadline - now, 0.05))  # also polls: a missed notify costs 50 ms at most
        try:
            conn = self.engine.raw_connection()
            if self._autocommit:
                dbapi_conn: Any = conn.dbapi_connection
                dbapi_conn.rollback()  # a pool's pre-ping may have left a transaction open
                dbapi_conn.autocommit = True
            return conn, conn.cursor()
        except BaseException:
            self._forget()
            raise

    def _give(self, slot: _Slot) -> None:
        self._idle.append(slot)
        if self._open >= self.pool_size:  # someone may be waiting
            with self._cond:
                self._cond.notify()

    def _forget(self) -> None:
        with self._cond:
            self._open -= 1
            self._cond.notify()

    def _drop(self, slot: _Slot) -> None:
        """A connection that failed is not reused: the next transaction opens a fresh one."""
        try:
            slot[0].invalidate()
        except Exception:  # a connection that is already broken cannot be closed cleanly
            pass
        self._forget()

    def _after_fork(self) -> None:
        # A forked child (multiprocessing) inherits the parent's connections: a shared
        # socket or SQLite handle corrupts both processes' transactions. The child opens
        # its own. The parent's are kept referenced, never used nor closed here: closing
        # (or garbage-collecting) them would end the parent's sessions.
        self._parents.append(self._idle)
        self._idle = []
        self._open = 0
        self._cond = threading.Condition(threading.Lock())  # the parent's may have been held at fork
        self.engine.dispose(close=False)

    @contextmanager
    def connection(self) -> Iterator[Any]:
        """A pooled DBAPI connection for a few statements of one's own (tests, benchmarks).
        On PostgreSQL it is in autocommit: a transaction of several statements says BEGIN."""
        slot = self._take()
        try:
            yield slot[0]
        except BaseException:
            self._drop(slot)
            raise
        self._give(slot)

    @property
    def open_connections(self) -> int:
        return self._open

    # -- statements -------------------------------------------------------------------

    def transaction(self, statements: Sequence[Statement]) -> Any:
        """Execute [(sql, params), ...] in one transaction; return the last statement's first row."""
        slot = self._take()
        cur = slot[1]
        has_rows = self.dialect.has_rows
        row = None
        try:
            if self._one_trip and len(statements) == 1:  # its own transaction: one round trip
                sql, params = statements[0]
                cur.execute(sql, params)
                row = cur.fetchone() if has_rows(cur) else None
            else:
                cur.execute(self._begin)
                for sql, params in statements:
                    cur.execute(sql, params)
                    row = cur.fetchone() if has_rows(cur) else None
                cur.execute("COMMIT")
        except BaseException:
            self._abort(slot)
            raise
        self._give(slot)
        return row

    def transaction_rows(self, statements: Sequence[Statement]) -> list[Any]:
        """Execute [(sql, params), ...] in one transaction; return every row they read back
        (a burst, watchdog.store.bursts: one status row per run)."""
        slot = self._take()
        cur = slot[1]
        has_rows = self.dialect.has_rows
        rows: list[Any] = []
        try:
            if self._one_trip and len(statements) == 1:  # its own transaction: one round trip
                cur.execute(*statements[0])
                if has_rows(cur):
                    rows += cur.fetchall()
            else:
                cur.execute(self._begin)
                for sql, params in statements:
                    cur.execute(sql, params)
                    if has_rows(cur):
                        rows += cur.fetchall()
                cur.execute("COMMIT")
        except BaseException:
            self._abort(slot)
            raise
        self._give(slot)
        return rows

    def query(self, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        """A read outside any write transaction (no write lock taken on SQLite)."""
        slot = self._take()
        try:
            cur = slot[1]
            cur.execute(sql, params)
            rows: list[Any] = cur.fetchall()
        except BaseException:
            self._abort(slot)
            raise
        self._give(slot)
        return rows

    def _abort(self, slot: _Slot) -> None:
        # Roll back explicitly before dropping the connection. Closing a sqlite3
        # connection while a cursor of the failed statement is still referenced
        # (by the traceback being raised) leaves a "zombie" connection that keeps
        # the transaction, and with it the database's write lock, until garbage
        # collection: every other agent would then wait out its busy timeout.
        conn, cur = slot
        for step in (cur.close, conn.rollback):
            try:
                step()
            except Exception:  # a broken connection cannot be rolled back: it is discarded below
                pass
        self._drop(slot)

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

    def close(self) -> None:
        """Close the idle connections (the process is done with the store)."""
        while True:
            try:
                slot = self._idle.pop()
            except IndexError:
                return
            self._drop(slot)

    discard = close  # the name before the pool


# Every Writer of this process, for the fork hook below (weakly: a closed Watchdog's goes).
_WRITERS: weakref.WeakSet[Writer] = weakref.WeakSet()


def _writers_after_fork() -> None:
    for writer in list(_WRITERS):
        writer._after_fork()


# In the child of a fork, before any of its code runs: no record checks its pid on the hot path.
os.register_at_fork(after_in_child=_writers_after_fork)
