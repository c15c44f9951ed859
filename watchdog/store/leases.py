"""The SQL of the daemons' leases: one daemon per host, one leader per store.

PostgreSQL: session-level advisory locks, taken with pg_try_advisory_lock on a
connection the daemon keeps for its lifetime. The database grants each lock to
one session at a time and frees it when the session ends (the daemon exited or
died), so two daemons started at once cannot both hold it. The `daemons` row
only names the holder and carries its expiry, read by the other daemons.

SQLite (one host): the row itself, read and written in one BEGIN IMMEDIATE
transaction: SQLite runs one writer at a time, so the check and the update are
one atomic step.

Times of a lease (`expires_at`) come from the database's clock on PostgreSQL, so
the hosts' clocks never have to agree.
"""

from __future__ import annotations

import datetime as dt
import hashlib
from dataclasses import dataclass
from typing import Any, Iterable

from sqlalchemy import BigInteger, String, and_, bindparam, case, func, insert, literal, null, select, text, update
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import DBAPIError
from sqlalchemy.sql import ColumnElement

from watchdog.core import lifecycle as lc
from watchdog.store import dialects
from watchdog.store.engine import store_unavailable
from watchdog.store.schema import ISO_GLOB, daemons, runs, utcnow

# Key space of our advisory locks: 64-bit keys derived from a name, so another
# application's advisory locks in the same database never collide with ours.
_LOCK_PREFIX = b"agent-watchdog:"


def lock_key(name: str) -> int:
    """A signed 64-bit advisory lock key for `name` (pg_try_advisory_lock(bigint))."""
    digest = hashlib.blake2b(_LOCK_PREFIX + name.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


def host_key(host: str) -> int:
    return lock_key(f"host:{host}")


LEADER_KEY = lock_key("leader")

# The driver's own errors (a broken session, a refused SET), for callers that may not import
# SQLAlchemy: the daemon's lease treats them as "this session is gone".
DriverError = DBAPIError


@dataclass(frozen=True)
class Holder:
    host: str
    pid: int
    pid_create_time: float
    started_at: dt.datetime
    last_tick_at: dt.datetime | None
    expires_at: dt.datetime | None
    leader_since: dt.datetime | None

    @classmethod
    def of(cls, row: Any) -> "Holder":
        return cls(row.host, row.pid, row.pid_create_time, row.started_at, row.last_tick_at, row.expires_at,
                   row.leader_since)


def holder(conn: Connection, host: str) -> Holder | None:
    row = conn.execute(select(daemons).where(daemons.c.host == host)).first()
    return Holder.of(row) if row is not None else None


def db_now(conn: Connection) -> dt.datetime:
    """The database's clock (PostgreSQL); this host's clock on SQLite (one host)."""
    return dialects.of(conn).db_now(conn)


def _expiry(conn: Connection, lease_s: float) -> Any:
    if conn.dialect.name == "postgresql":
        return text("clock_timestamp() + make_interval(secs => :lease_s)").bindparams(lease_s=float(lease_s))
    return utcnow() + dt.timedelta(seconds=lease_s)


# --- PostgreSQL advisory locks (on the lease's own connection) --------------------------


def try_lock(conn: Connection, key: int) -> bool:
    return bool(conn.execute(text("SELECT pg_try_advisory_lock(:k)"), {"k": key}).scalar())


def unlock(conn: Connection, key: int) -> None:
    conn.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": key})


def unlock_all(conn: Connection) -> None:
    """Free every advisory lock of this session now. Closing the socket frees them too, but
    only once the server's backend has noticed and exited: a moment later, long enough for a
    survivor's try at the next tick to fail."""
    conn.execute(text("SELECT pg_advisory_unlock_all()"))


def held_keys(conn: Connection) -> set[int]:
    """The advisory lock keys (bigint form) some session of this database holds now."""
    rows = conn.execute(text(
        "SELECT classid::bigint, objid::bigint FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 1 "
        "AND granted AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"))
    keys = set()
    for hi, lo in rows:
        unsigned = (int(hi) << 32) | int(lo)
        keys.add(unsigned - (1 << 64) if unsigned >= 1 << 63 else unsigned)
    return keys


def session_keepalives(conn: Connection, idle_s: int) -> None:
    """Let the SERVER notice a vanished host within a few ticks (its TCP keepalives; the
    default is the OS's two hours), so the locks of a dead host's daemon are freed."""
    idle_s = max(1, int(idle_s))
    for name, value in (("tcp_keepalives_idle", idle_s), ("tcp_keepalives_interval", max(1, idle_s // 3)),
                        ("tcp_keepalives_count", 3)):
        conn.execute(text(f"SET {name} = {int(value)}"))


# --- the row --------------------------------------------------------------------------


def write_holder(conn: Connection, *, host: str, pid: int, create_time: float, lease_s: float) -> None:
    """Make this process the named holder of `host`'s row (the caller holds the lease)."""
    values = dict(pid=pid, pid_create_time=create_time, started_at=utcnow(), last_tick_at=None,
                  expires_at=_expiry(conn, lease_s), leader_since=None)
    done = conn.execute(update(daemons).where(daemons.c.host == host).values(**values))
    if done.rowcount == 0:
        conn.execute(insert(daemons).values(host=host, **values))


def renew(conn: Connection, *, host: str, pid: int, create_time: float, lease_s: float, leader: bool,
          tick: tuple[dt.datetime, int | None] | None = None) -> bool:
    """Extend the lease row if it still names this process; False if another took it. `tick`:
    (when it ended, the newest event id it folded), recorded by the same statement (one round
    trip per tick on the lease's session, see record_tick)."""
    pg = conn.dialect.name == "postgresql"
    params: dict[str, Any] = {"b_host": host, "b_pid": pid, "b_ctime": create_time, "b_now": utcnow()}
    params["b_lease_s" if pg else "b_expires"] = float(lease_s) if pg else utcnow() + dt.timedelta(seconds=lease_s)
    if tick is not None:
        params.update(b_tick_at=tick[0], b_event_id=tick[1])
    done = conn.execute(_renew_statement(pg, leader, tick is not None), params)
    return done.rowcount == 1


_RENEW: dict[tuple[bool, bool, bool], Any] = {}


def _renew_statement(pg: bool, leader: bool, with_tick: bool) -> Any:
    """renew's UPDATE, built once per shape (every tick runs it: building it anew cost more
    than the database's work)."""
    key = (pg, leader, with_tick)
    q = _RENEW.get(key)
    if q is None:
        c = daemons.c
        mine = and_(c.host == bindparam("b_host"), c.pid == bindparam("b_pid"),
                    c.pid_create_time == bindparam("b_ctime"))
        values: dict[str, Any] = {
            "expires_at": (text("clock_timestamp() + make_interval(secs => :b_lease_s)") if pg
                           else bindparam("b_expires", type_=c.expires_at.type)),
            # a leader keeps the time it became one; a follower holds none
            "leader_since": func.coalesce(c.leader_since, bindparam("b_now", type_=c.leader_since.type))
            if leader else None}
        if with_tick:
            values.update(last_tick_at=bindparam("b_tick_at", type_=c.last_tick_at.type),
                          last_event_id=bindparam("b_event_id", type_=c.last_event_id.type))
        q = _RENEW[key] = update(daemons).where(mine).values(**values)
    return q


def follow(conn: Connection, *, host: str, pid: int, create_time: float, lease_s: float,
           tick: tuple[dt.datetime, int | None] | None = None) -> tuple[bool, bool]:
    """A follower's tick on its lease's session (PostgreSQL), one round trip: try the leader lock
    and extend the lease row if it still names this process, recording `tick` (the last tick's
    end and newest event folded) when given; the row names a leader (`leader_since`) only if the
    lock was taken. -> (leader now, row renewed)."""
    params: dict[str, Any] = {"b_key": LEADER_KEY, "b_host": host, "b_pid": pid, "b_ctime": create_time,
                              "b_now": utcnow(), "b_lease_s": float(lease_s)}
    if tick is not None:
        params.update(b_tick_at=tick[0], b_event_id=tick[1])
    got, renewed = conn.execute(_follow_statement(tick is not None), params).one()
    return bool(got), bool(renewed)


_FOLLOW: dict[bool, Any] = {}


def _follow_statement(with_tick: bool) -> Any:
    """follow's statement: the lock's try in a CTE of its own (a volatile function: evaluated once,
    whether the row matches or not), the UPDATE in another, both answered by one SELECT."""
    q = _FOLLOW.get(with_tick)
    if q is None:
        c = daemons.c
        got = select(func.pg_try_advisory_lock(bindparam("b_key", type_=BigInteger())).label("got")).cte("leader_try")
        mine = and_(c.host == bindparam("b_host"), c.pid == bindparam("b_pid"),
                    c.pid_create_time == bindparam("b_ctime"))
        values: dict[str, Any] = {
            "expires_at": text("clock_timestamp() + make_interval(secs => :b_lease_s)"),
            "leader_since": case((select(got.c.got).scalar_subquery(),
                                  func.coalesce(c.leader_since, bindparam("b_now", type_=c.leader_since.type))),
                                 else_=null())}
        if with_tick:
            values.update(last_tick_at=bindparam("b_tick_at", type_=c.last_tick_at.type),
                          last_event_id=bindparam("b_event_id", type_=c.last_event_id.type))
        renewed = update(daemons).where(mine).values(**values).returning(c.host).cte("renewed")
        q = _FOLLOW[with_tick] = select(got.c.got, select(func.count()).select_from(renewed).scalar_subquery())
    return q


def release(conn: Connection, *, host: str, pid: int) -> None:
    """The lease ends now; the row stays, naming the last holder (for the no-daemon alert)."""
    conn.execute(update(daemons).where(and_(daemons.c.host == host, daemons.c.pid == pid))
                 .values(expires_at=utcnow() if conn.dialect.name == "sqlite" else func.clock_timestamp(),
                         leader_since=None))


def other_live_leader(conn: Connection, host: str) -> str | None:
    """SQLite: the host of another daemon whose lease is live and that leads, if any."""
    now = db_now(conn)
    leader: str | None = conn.execute(select(daemons.c.host).where(and_(
        daemons.c.host != host, daemons.c.leader_since.is_not(None), daemons.c.expires_at > now))).scalar()
    return leader


# --- hosts without a live daemon ---------------------------------------------------------


def active_hosts(conn: Connection, exclude: str) -> dict[str, int]:
    """Hosts with active runs (but `exclude`), with how many (an index-only scan)."""
    q = (select(runs.c.host, func.count()).where(and_(runs.c.status.in_(lc.ACTIVE_STATUSES), runs.c.host != exclude))
         .group_by(runs.c.host))
    return {h: int(n) for h, n in conn.execute(q)}


# Hosts per read of their leases: the drivers bind at most 65,535 values a statement, and an agent
# may name as many hosts as it starts runs.
HOSTS_PER_READ = 1000

# No daemon writes a lease this long (a few ticks): an expiry further out was written by hand,
# and must not keep a dead host "live" (its runs never adopted) for ever.
MAX_LEASE_S = 86400.0


def orphans(conn: Connection, hosts_in: Iterable[str]) -> dict[str, Holder | None]:
    """Of `hosts`, those without a live daemon: no row, a lease past its expiry, or (PostgreSQL)
    a host lock no session holds any more (its daemon died moments ago). -> {host: last holder}."""
    hosts = list(hosts_in)
    if not hosts:
        return {}
    # Liveness is computed by the database and the rows' other columns read only for the hosts
    # found dead, each on its own: a lease row anyone wrote by hand (an expiry that does not
    # parse, or 'infinity') must not fail the tick, and it counts as expired, never as live.
    # (The leader asks this every tick: one statement, the database's clock read inside it.)
    sqlite = conn.dialect.name == "sqlite"
    params: dict[str, Any] = {}
    if sqlite:
        params["b_now"] = db_now(conn).astimezone(dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S.%f")
    live_of: dict[str, Any] = {}
    for i in range(0, len(hosts), HOSTS_PER_READ):  # any writer names hosts: never one bound value per host
        params["b_hosts"] = hosts[i : i + HOSTS_PER_READ]
        live_of.update(conn.execute(_live_statement(sqlite), params).all())
    # The locks matter only for a host whose row says live (no row, or an expired one: dead anyway).
    held = held_keys(conn) if conn.dialect.name == "postgresql" and any(live_of.values()) else None
    out: dict[str, Holder | None] = {}
    for h in hosts:
        live = bool(live_of.get(h))
        if live and held is not None and host_key(h) not in held:
            live = False
        if not live:
            out[h] = _holder(conn, h) if h in live_of else None
    return out


_LIVE: dict[bool, Any] = {}


def _live_statement(sqlite: bool) -> Any:
    """(host, whether its lease is live) of the hosts bound as `b_hosts`, the liveness computed
    by the database; built once (the leader asks it every tick)."""
    q = _LIVE.get(sqlite)
    if q is None:
        exp = daemons.c.expires_at
        fresh: ColumnElement[Any]
        if sqlite:  # this host's clock, bound as `b_now` (one host: db_now)
            jnow = func.julianday(bindparam("b_now", type_=String()))
            fresh = case((exp.op("GLOB")(literal(ISO_GLOB, String())),
                          and_(func.julianday(exp) > jnow, func.julianday(exp) <= jnow + MAX_LEASE_S / 86400.0)),
                         else_=False)
        else:
            clock = func.clock_timestamp()
            fresh = and_(func.isfinite(exp), exp > clock, exp <= clock + dt.timedelta(seconds=MAX_LEASE_S))
        q = _LIVE[sqlite] = select(daemons.c.host, fresh).where(daemons.c.host.in_(bindparam("b_hosts", expanding=True)))
    return q


def _holder(conn: Connection, host: str) -> Holder | None:
    """The last holder of a host's lease, if its row reads at all."""
    try:
        q = select(daemons).where(daemons.c.host == host)
        if conn.get_execution_options().get("isolation_level") == "AUTOCOMMIT":
            row = conn.execute(q).first()  # the lease's session: a failed statement aborts nothing
        else:
            with conn.begin_nested():
                row = conn.execute(q).first()
        return Holder.of(row) if row is not None else None
    except Exception as exc:  # noqa: BLE001 — a hand-written row: its holder is unknown
        if store_unavailable(exc):
            raise
        return None


def live_daemons(conn: Connection) -> list[Holder]:
    now = db_now(conn)
    q = select(daemons).where(daemons.c.expires_at > now).order_by(daemons.c.host)
    return [Holder.of(r) for r in conn.execute(q)]


def record_tick(conn: Connection, host: str, *, now: dt.datetime, last_event_id: int | None,
                pid: int | None = None) -> None:
    """After a tick: when it ended and the newest event it folded, on the host's row (only if
    the row still names `pid`, when given: a row another daemon took is not written)."""
    mine = daemons.c.host == host if pid is None else and_(daemons.c.host == host, daemons.c.pid == pid)
    conn.execute(update(daemons).where(mine).values(last_tick_at=now, last_event_id=last_event_id))


# --- the lease's own session (PostgreSQL) ------------------------------------------------


def is_postgres(engine: Engine) -> bool:
    """Advisory locks on a session of their own (PostgreSQL), or the row under SQLite's write lock."""
    return engine.dialect.name == "postgresql"


def open_session(engine: Engine) -> Connection:
    """A connection of the lease's own, in autocommit: it never holds a transaction open, and
    its session-level locks live as long as it does. Its writes (the lease row, each tick) do not
    wait for the log flush: a database crash may lose the last renewal, which the next tick writes."""
    conn = engine.connect().execution_options(isolation_level="AUTOCOMMIT")
    dialects.of(conn).commit_without_flush(conn, session=True)
    return conn


def note_tick(engine: Engine, host: str, *, now: dt.datetime, last_event_id: int | None) -> None:
    """`record_tick` in a transaction of its own, for a daemon without a lease (tests, --once)."""
    with engine.begin() as conn:
        dialects.of(conn).commit_without_flush(conn)
        record_tick(conn, host, now=now, last_event_id=last_event_id)


def ping(conn: Connection) -> None:
    """Raises when the session is gone (and its locks with it)."""
    conn.exec_driver_sql("SELECT 1")


def end_session(conn: Connection | None) -> None:
    """Close the DBAPI connection itself: returned to the pool, the session (and the
    advisory locks it holds) would live on."""
    if conn is None:
        return
    try:
        conn.invalidate()
    except Exception:  # noqa: BLE001 — already broken
        pass
    try:
        conn.close()
    except Exception:  # noqa: BLE001
        pass
