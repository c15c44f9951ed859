"""The daemon's leases: one daemon per (store, host), one leader per store.

Per host, because only a host's own daemon may signal its processes: a second
daemon on the same host would race the first through the stop ladder. Per
store, one leader, because the cluster duties (tool circuits, the all-runs rate
alarm, adopting hosts without a daemon, sealing ended runs, retention) must run
exactly once whatever the number of hosts.

PostgreSQL: advisory locks held by a connection this process keeps (see
`watchdog.store.leases`). A crashed daemon's session ends and frees its locks at
once; the server's TCP keepalives on that session free a vanished host's within
a few ticks. The leader lock is tried at the start of every tick by every other
daemon, so a dead leader is replaced at the next tick of any survivor: in the same
statement that extends that daemon's lease and records its last tick (a follower's
one round trip a tick on its lease's session, `watchdog.store.leases.follow`).

SQLite: one host, one daemon, which is also the leader.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import time
from typing import Any, Callable, TypeVar

from watchdog.core.procid import current_create_time
from watchdog.errors import StoreError
from watchdog.store import leases as sql
from watchdog.store.engine import Connection, Engine, read_connection, store_unavailable
from watchdog.store.leases import DriverError, Holder

log = logging.getLogger("watchdog.lease")

T = TypeVar("T")

# A lease lives this many ticks past the daemon's last completed tick (and never less than
# LEASE_MIN_S): a tick that is slow once does not make the other daemons adopt the host.
LEASE_TICKS = 3
LEASE_MIN_S = 15.0
# A daemon refused the host lock waits this long for the holder's row to name it.
HOLDER_WAIT_S = 5.0


def lease_s_for(tick_s: float) -> float:
    return max(LEASE_MIN_S, LEASE_TICKS * tick_s)


class AlreadyRunning(StoreError):
    """Another live daemon holds this host's lease: this one must not run (and exits 0)."""

    def __init__(self, host: str, holder: Holder | None, pid: int | None = None) -> None:
        self.host = host
        self.holder = holder
        self.pid = pid if pid is not None else (holder.pid if holder is not None else None)
        if holder is None:
            who = f"another agent-watchdog daemon (pid {pid})" if pid else "another agent-watchdog daemon"
        else:
            who = (f"another agent-watchdog daemon (pid {holder.pid}, started "
                   f"{holder.started_at:%Y-%m-%d %H:%M:%S} UTC)")
        super().__init__(f"{who} is already watching this store on {host}; this one exits")


class LeaseLost(StoreError):
    """This daemon's lease was taken over: it must stop acting at once."""


class Lease:
    """The host lease and the leadership of one daemon process."""

    def __init__(self, engine: Engine, host: str, *, tick_s: float,
                 alive: Callable[[Holder], bool] | None = None) -> None:
        self.engine = engine
        self.host = host
        self.pid = os.getpid()
        self.create_time = current_create_time() or 0.0
        self.lease_s = lease_s_for(tick_s)
        self.tick_s = tick_s
        self._alive = alive  # (Holder) -> bool: is this same-host holder's process running (SQLite)
        self.held = False
        self.leader = False

    # -- what the daemon calls ---------------------------------------------------------

    def acquire(self) -> None:
        raise NotImplementedError

    def refresh(self, *, ping: bool = True) -> bool:
        """At the start of a tick: still ours? Leader now? -> leader. Raises LeaseLost. `ping`:
        prove a leader's session alive now; False when the caller's next statement on it (`read`)
        does."""
        raise NotImplementedError

    def touch(self, now: dt.datetime, last_event_id: int | None) -> None:
        """After a tick: extend the lease (and record the tick). Raises LeaseLost."""
        raise NotImplementedError

    def release(self) -> None:
        raise NotImplementedError

    def read(self, fn: Callable[[Connection], T]) -> T:
        """`fn` on a read snapshot of the store (PostgreSQL: on the lease's own session)."""
        with read_connection(self.engine) as conn:
            return fn(conn)

    def _mine(self) -> dict[str, Any]:
        return dict(host=self.host, pid=self.pid, create_time=self.create_time)


def lease_for(engine: Engine, host: str, *, tick_s: float, alive: Callable[[Holder], bool] | None = None) -> Lease:
    if sql.is_postgres(engine):
        return PgLease(engine, host, tick_s=tick_s)
    return SqliteLease(engine, host, tick_s=tick_s, alive=alive)


class SqliteLease(Lease):
    """SQLite: one host, one daemon, and the flock (watchdog.daemon.leases.hostlock) already proves it
    is this one. The row is written for the others to read (the CLI); a row someone else wrote
    (any store writer can) is written again, never obeyed: this daemon stays the leader."""

    def acquire(self) -> None:
        with self.engine.begin() as conn:
            sql.write_holder(conn, **self._mine(), lease_s=self.lease_s)
        self.held = True

    def refresh(self, *, ping: bool = True) -> bool:
        self.leader = True
        return True

    def touch(self, now: dt.datetime, last_event_id: int | None) -> None:
        with self.engine.begin() as conn:
            if not sql.renew(conn, **self._mine(), lease_s=self.lease_s, leader=True, tick=(now, last_event_id)):
                row = sql.holder(conn, self.host)
                log.warning("the daemons row of %s was rewritten by a store writer (it named %s): written again; "
                            "the lease is this daemon's lock file, not the row", self.host,
                            f"pid {row.pid}" if row is not None else "nobody")
                sql.write_holder(conn, **self._mine(), lease_s=self.lease_s)
                sql.renew(conn, **self._mine(), lease_s=self.lease_s, leader=True, tick=(now, last_event_id))

    def release(self) -> None:
        if not self.held:
            return
        with self.engine.begin() as conn:
            sql.release(conn, host=self.host, pid=self.pid)
        self.held = self.leader = False


class PgLease(Lease):
    """Advisory locks on a connection of our own, in autocommit (never an open transaction)."""

    def __init__(self, engine: Engine, host: str, *, tick_s: float) -> None:
        super().__init__(engine, host, tick_s=tick_s)
        self._conn: Connection | None = None
        self._host_locked = False
        self._key = sql.host_key(host)
        self._last_tick: tuple[dt.datetime, int | None] | None = None  # a follower's, for its next refresh

    def _connect(self) -> Connection:
        conn = sql.open_session(self.engine)
        try:
            sql.session_keepalives(conn, max(1, int(min(self.tick_s, 30))))
        except DriverError:
            log.debug("could not set the lease session's keepalives", exc_info=True)
        return conn

    def _drop(self) -> None:
        """After any error on the lease connection: its locks may be gone with it. Ending
        it (never letting it reconnect silently) makes the next tick take them afresh."""
        conn, self._conn = self._conn, None
        self.leader = False
        sql.end_session(conn)

    def acquire(self) -> None:
        conn = self._connect()
        try:
            self._host_locked = sql.try_lock(conn, self._key)
            if not self._host_locked:
                # The flock says no daemon of this host watches this store: the session holding
                # the host lock is a daemon of another machine with our host name, or a store
                # session squatting it. Neither makes this daemon exit; it says so and retries.
                row = self._wait_for_holder(conn)
                log.error("the store's host lock for %s is held by another session (%s) although this daemon "
                          "holds the host's lock file: a second machine named %s, or a store writer squatting "
                          "it; watching anyway, and retrying the lock every tick", self.host,
                          f"pid {row.pid}" if row is not None else "no daemons row", self.host)
            sql.write_holder(conn, **self._mine(), lease_s=self.lease_s)
        except BaseException:
            sql.end_session(conn)  # frees whatever it took
            raise
        self._conn = conn
        self.held = True

    def _wait_for_holder(self, conn: Connection) -> Holder | None:
        """The row of the session holding the lock: it writes it right after locking."""
        deadline = time.monotonic() + HOLDER_WAIT_S
        while True:
            row = sql.holder(conn, self.host)
            if row is not None and row.expires_at is not None and row.expires_at > sql.db_now(conn):
                return row
            if time.monotonic() > deadline:
                return row
            time.sleep(0.1)

    def refresh(self, *, ping: bool = True) -> bool:
        try:
            if self._conn is None:  # the session was lost (a database blip): take the locks again
                conn = self._connect()
                self._host_locked = sql.try_lock(conn, self._key)
                self._conn = conn
                log.info("store session for %s open again after the store came back%s", self.host,
                         "" if self._host_locked else " (its host lock is held by another session)")
            elif not self._host_locked:
                self._host_locked = sql.try_lock(self._conn, self._key)
            assert self._conn is not None  # set just above
            conn = self._conn
            if self.leader:
                if ping:
                    sql.ping(conn)  # our session lives: its locks are ours
            else:
                # A follower's one round trip of the tick: the leader lock tried, the lease
                # extended and the last tick recorded (touch left it for here), in one statement.
                tick, self._last_tick = self._last_tick, None
                self.leader, renewed = sql.follow(conn, **self._mine(), lease_s=self.lease_s, tick=tick)
                if not renewed:
                    self._rewrite(conn, tick)
                if self.leader:
                    log.info("leader of the store: this daemon now does the cluster duties")
        except LeaseLost:
            raise
        except Exception:
            self._drop()
            raise
        return self.leader

    def touch(self, now: dt.datetime, last_event_id: int | None) -> None:
        """A leader extends its lease now; a follower's tick is recorded by its next refresh,
        with the leader lock's try (one round trip a tick: its row's last tick is a tick behind,
        and its lease runs from the start of its last tick, LEASE_TICKS ticks long)."""
        conn = self._conn
        if conn is None:
            return
        if not self.leader:
            self._last_tick = (now, last_event_id)
            return
        try:
            if not sql.renew(conn, **self._mine(), lease_s=self.lease_s, leader=True,
                             tick=(now, last_event_id)):
                self._rewrite(conn, (now, last_event_id))
        except Exception:
            self._drop()
            raise

    def _rewrite(self, conn: Connection, tick: tuple[dt.datetime, int | None] | None) -> None:
        """We hold the host lock, so nobody else could take the row: it was deleted or edited by
        hand. Write it again (naming the leader if this daemon leads)."""
        sql.write_holder(conn, **self._mine(), lease_s=self.lease_s)
        if self.leader:
            sql.renew(conn, **self._mine(), lease_s=self.lease_s, leader=True)
        if tick is not None:
            sql.record_tick(conn, self.host, now=tick[0], last_event_id=tick[1], pid=self.pid)

    def read(self, fn: Callable[[Connection], T]) -> T:
        """`fn` on the lease's own session: one round trip per statement, no checkout, no
        transaction (the leader's per-tick read of the hosts without a daemon). Its failure
        ends the session, as any other on it does: the next tick takes the locks afresh."""
        conn = self._conn
        if conn is None:
            return super().read(fn)
        try:
            return fn(conn)
        except Exception as exc:
            # Only a session that may be gone is ended: a read that failed on what it read (rows
            # any store writer can add) must not cost this daemon its locks.
            if store_unavailable(exc) or conn.invalidated or conn.closed:
                self._drop()
            raise

    def release(self) -> None:
        if self._conn is None:
            self.held = False
            return
        try:
            tick, self._last_tick = self._last_tick, None
            if tick is not None:  # a follower's last tick, not recorded yet (touch)
                sql.record_tick(self._conn, self.host, now=tick[0], last_event_id=tick[1], pid=self.pid)
            sql.release(self._conn, host=self.host, pid=self.pid)
            # Freed before the socket closes, so the next leader can take over at once.
            sql.unlock_all(self._conn)
        except Exception:  # noqa: BLE001 — closing the session frees the locks anyway
            log.warning("could not mark the lease released", exc_info=True)
        finally:
            conn, self._conn = self._conn, None
            self.held = self.leader = False
            sql.end_session(conn)  # both locks are freed with the session

