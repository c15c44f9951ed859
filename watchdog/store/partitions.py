"""The day partitions of `events` on PostgreSQL (revision 0015): made ahead, dropped whole.

`events` is partitioned by range of `stored_at` (the server's now() at insert), one partition per
UTC day named `events_pYYYYMMDD`, and `events_default` for a row no day covers (a daemon that was
down for days: its rows still land). The daemon's leader makes today's and the next DAYS_AHEAD
days' partitions (`ensure_ahead`), idempotently; retention detaches and drops a whole day once
every run with events in it may be pruned (`drop_expired`), which takes milliseconds where
deleting its rows took minutes and left the table bloated.

A run that may not be pruned yet (still active, ended after the cutoff, an alert waiting) keeps
its events: they are moved into the default partition in the transaction that drops the day, so
the drop never takes evidence from a run retention keeps. SQLite keeps one table: every function
here does nothing there.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Callable
from dataclasses import dataclass

from sqlalchemy import ColumnElement, select, text
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import OperationalError

from watchdog.store.schema import runs

DAYS_AHEAD = 2  # day partitions kept made beyond today (a daemon down that long still loses nothing)
DEFAULT = "events_default"
# Waiting for the lock that attaching or detaching a partition takes on `events`: every writer
# queues behind a waiting DDL statement, so it waits only this long; a writer's transaction left
# open (idle in transaction, a long batch) makes the attempt give up, and it is tried again later.
LOCK_TIMEOUT_MS = 100
_BUSY_STATES = ("55P03", "40P01")  # lock_not_available (the timeout), deadlock_detected
# What the partitioned events table has that the models (one for both backends) do not, and the
# reverse: the models' drift check (tests/store/test_migrations.py) accepts exactly these.
PG_ONLY = ("stored_at", "ix_events_run_id_seq")  # the partition key; the index (run_id, seq)
MODEL_ONLY = ("uq_events_run_id_seq",)  # enforced by the trigger events_seq_once instead
_BOUND = re.compile(r"FROM \('([^']+)'\) TO \('([^']+)'\)")
_DAY_NAME = "events_p{:%Y%m%d}"


class Busy(Exception):
    """`events` stayed locked longer than LOCK_TIMEOUT_MS: the partitions in `made` were made, the
    rest is for a later attempt."""

    def __init__(self, made: list[str]) -> None:
        super().__init__("events is locked by an open transaction")
        self.made = made


def _is_busy(exc: OperationalError) -> bool:
    return getattr(exc.orig, "sqlstate", None) in _BUSY_STATES


@dataclass(frozen=True)
class DayPartition:
    name: str
    lo: dt.datetime  # inclusive, UTC
    hi: dt.datetime  # exclusive


def is_partitioned(conn: Connection) -> bool:
    """True on a store whose events are partitioned (PostgreSQL from revision 0015)."""
    if conn.dialect.name != "postgresql":
        return False
    kind = conn.execute(text("SELECT relkind FROM pg_class WHERE oid = to_regclass('events')")).scalar()
    return bool(kind == "p")


def day_partitions(conn: Connection) -> list[DayPartition]:
    """Every range partition of events, oldest first (the default partition is not one)."""
    rows = conn.execute(text(
        "SELECT c.relname, pg_get_expr(c.relpartbound, c.oid) FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
        "WHERE i.inhparent = to_regclass('events')")).all()
    out = []
    for name, bound in rows:
        m = _BOUND.search(bound or "")
        if m:  # DEFAULT has no range
            lo, hi = (dt.datetime.fromisoformat(v).astimezone(dt.timezone.utc) for v in m.groups())
            out.append(DayPartition(name, lo, hi))
    return sorted(out, key=lambda p: p.lo)


def _day_bounds(day: dt.date) -> tuple[str, str]:
    nxt = day + dt.timedelta(days=1)
    return f"{day.isoformat()} 00:00:00+00", f"{nxt.isoformat()} 00:00:00+00"


def _q(conn: Connection, name: str) -> str:
    return conn.dialect.identifier_preparer.quote(name)


def _make_day(conn: Connection, day: dt.date) -> str:
    """One day's partition, in the caller's transaction. Rows of that day already in the default
    partition (it was not made in time) move into it: PostgreSQL refuses a partition whose range
    the default partition holds rows of."""
    name, (lo, hi) = _DAY_NAME.format(day), _day_bounds(day)
    q, rng = _q(conn, name), f"FOR VALUES FROM ('{lo}') TO ('{hi}')"
    conn.execute(text(f"SET LOCAL lock_timeout = {LOCK_TIMEOUT_MS}"))
    stray = conn.execute(text(f"SELECT EXISTS (SELECT 1 FROM {DEFAULT} WHERE stored_at >= :lo AND stored_at < :hi)"),
                         {"lo": lo, "hi": hi}).scalar()
    if stray:
        conn.execute(text(f"CREATE TABLE {q} (LIKE events INCLUDING DEFAULTS)"))
        moved = f"{DEFAULT} WHERE stored_at >= :lo AND stored_at < :hi"
        conn.execute(text(f"INSERT INTO {q} SELECT * FROM {moved}"), {"lo": lo, "hi": hi})
        conn.execute(text(f"DELETE FROM {moved}"), {"lo": lo, "hi": hi})
        conn.execute(text(f"ALTER TABLE events ATTACH PARTITION {q} {rng}"))
    else:
        conn.execute(text(f"CREATE TABLE IF NOT EXISTS {q} PARTITION OF events {rng}"))
    # Owned as events is (the daemon may log in as a member of the owner role): the triggers'
    # "trusted" test (TRUNCATE on the table) then means the same on every partition.
    owner = conn.execute(text("SELECT relowner::regrole::text FROM pg_class WHERE oid = to_regclass('events')")).scalar()
    mine = conn.execute(text("SELECT relowner::regrole::text FROM pg_class WHERE oid = to_regclass(:n)"),
                        {"n": name}).scalar()
    if owner and mine != owner:
        conn.execute(text(f"ALTER TABLE {q} OWNER TO {owner}"))
    lock_down(conn, name)
    return name


def lock_down(conn: Connection, name: str) -> None:
    """A partition is read and written only through `events`, whose policies and grants apply to
    every statement through it: no grant of its own (the owner's default privileges would give
    one, bypassing the parent's row-level security and column grants) and row-level security with
    no policy, so nobody but the owner reaches it directly."""
    q = _q(conn, name)
    conn.execute(text(f"REVOKE ALL ON {q} FROM PUBLIC"))
    for (grantee,) in conn.execute(text(
            "SELECT DISTINCT quote_ident(a.grantee::regrole::text) FROM pg_class c, aclexplode(c.relacl) a "
            "WHERE c.oid = to_regclass(:n) AND a.grantee <> 0 AND a.grantee <> c.relowner"), {"n": name}).all():
        conn.execute(text(f"REVOKE ALL ON {q} FROM {grantee}"))
    conn.execute(text(f"ALTER TABLE {q} ENABLE ROW LEVEL SECURITY"))


def ensure_ahead(engine: Engine, days_ahead: int = DAYS_AHEAD) -> list[str]:
    """Make the partitions of today (UTC, the server's clock) and the next `days_ahead` days that
    do not exist yet; the names made. Idempotent; nothing on SQLite or an unpartitioned store.
    Raises Busy when `events` stays locked (the rest is made at the next attempt)."""
    with engine.connect() as conn:
        if not is_partitioned(conn):
            return []
        today = conn.execute(text("SELECT (now() AT TIME ZONE 'UTC')::date")).scalar_one()
        have = {p.lo.date() for p in day_partitions(conn)}
    made = []
    for n in range(days_ahead + 1):
        day = today + dt.timedelta(days=n)
        if day not in have:
            try:
                with engine.begin() as conn:
                    made.append(_make_day(conn, day))
            except OperationalError as exc:
                if not _is_busy(exc):
                    raise
                raise Busy(made) from exc
    return made


def _run_ids_in(conn: Connection, name: str) -> list[str]:
    """The distinct run ids of one partition, by a skip scan of its (run_id, seq) index: one probe
    per run, not a read of every event."""
    q = _q(conn, name)
    return list(conn.execute(text(
        f"WITH RECURSIVE ids AS ((SELECT run_id FROM {q} ORDER BY run_id LIMIT 1) UNION ALL "
        f"SELECT (SELECT e.run_id FROM {q} e WHERE e.run_id > ids.run_id ORDER BY e.run_id LIMIT 1) "
        f"FROM ids WHERE ids.run_id IS NOT NULL) SELECT run_id FROM ids WHERE run_id IS NOT NULL")).scalars())


def _drop_one(conn: Connection, p: DayPartition, prunable: ColumnElement[bool],
              tick: Callable[[], float]) -> tuple[float, int, int]:
    """Detach and drop one day, keeping what the runs retention keeps had in it: (when the
    writers' wait began, the rows it held, the rows kept)."""
    # Every lock of this transaction (the DETACH's, the kept runs' rows the move's trigger locks)
    # is waited for only so long: the writers queue behind it.
    conn.execute(text(f"SET LOCAL lock_timeout = {LOCK_TIMEOUT_MS}"))
    q = _q(conn, p.name)
    ids = _run_ids_in(conn, p.name)
    kept: list[str] = []
    for i in range(0, len(ids), 1000):
        chunk = ids[i:i + 1000]
        # NULL-safe: a run whose condition is NULL (an ended run with no ended_at) is kept.
        kept += conn.execute(select(runs.c.id).where(runs.c.id.in_(chunk), prunable.is_not(True))).scalars().all()
    total = conn.execute(text(f"SELECT count(*) FROM {q}")).scalar_one()
    t_lock = tick()  # from here to the commit the writers of events wait
    conn.execute(text(f"ALTER TABLE events DETACH PARTITION {q}"))
    moved = 0
    if kept:
        # Its range is no partition's now: they land in the default partition.
        moved = conn.execute(text(f"INSERT INTO events SELECT * FROM {q} WHERE run_id = ANY(:ids)"),
                             {"ids": kept}).rowcount
    conn.execute(text(f"DROP TABLE {q}"))
    return t_lock, total, moved


@dataclass
class Dropped:
    partitions: int = 0
    events: int = 0
    kept_events: int = 0  # of runs retention keeps, moved to the default partition
    longest_s: float = 0.0
    locked_s: float = 0.0  # the longest time `events` was locked against the writers (DETACH to commit)
    busy: str | None = None  # the partition left for later: `events` stayed locked (Busy)


def drop_expired(engine: Engine, cutoff: dt.datetime, prunable: ColumnElement[bool],
                 out_of_time: Callable[[], bool] = lambda: False,
                 clock: Callable[[], float] | None = None) -> Dropped:
    """Drop every day partition that ends at or before `cutoff`, each in its own transaction.
    `prunable` is retention's condition on `runs`: the events of a run it does not hold for are
    kept (moved to the default partition) and the day still goes. A day whose DETACH would wait
    longer than LOCK_TIMEOUT_MS (an open transaction on events) is left, named in `busy`, and so
    are the days after it: the caller deletes rows as before and tries the days again later."""
    import time

    tick = clock or time.perf_counter
    done = Dropped()
    with engine.connect() as conn:
        if not is_partitioned(conn):
            return done
        expired = [p for p in day_partitions(conn) if p.hi <= cutoff]
    for p in expired:
        if out_of_time():
            break
        t0 = tick()
        try:
            with engine.begin() as conn:
                t_lock, total, moved = _drop_one(conn, p, prunable, tick)
        except OperationalError as exc:
            if not _is_busy(exc):
                raise
            # The lock is on `events`: every other day would wait for the same transaction.
            done.busy = p.name
            break
        done.locked_s = max(done.locked_s, tick() - t_lock)
        done.partitions += 1
        done.events += total - moved
        done.kept_events += moved
        done.longest_s = max(done.longest_s, tick() - t0)
    return done


__all__ = ["DAYS_AHEAD", "DEFAULT", "Busy", "lock_down", "MODEL_ONLY", "PG_ONLY", "DayPartition", "Dropped", "day_partitions", "drop_expired", "ensure_ahead",
           "is_partitioned"]
