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

from sqlalchemy import ColumnElement, not_, select, text
from sqlalchemy.engine import Connection, Engine

from watchdog.store.schema import runs

DAYS_AHEAD = 2  # day partitions kept made beyond today (a daemon down that long still loses nothing)
DEFAULT = "events_default"
# Waiting for the lock that attaching or detaching a partition takes on `events`: the agents'
# transactions are short, and a DDL statement queued behind a long one would hold up every insert.
LOCK_TIMEOUT_MS = 2000
# What the partitioned events table has that the models (one for both backends) do not, and the
# reverse: the models' drift check (tests/store/test_migrations.py) accepts exactly these.
PG_ONLY = ("stored_at", "ix_events_run_id_seq")  # the partition key; the index (run_id, seq)
MODEL_ONLY = ("uq_events_run_id_seq",)  # enforced by the trigger events_seq_once instead
_BOUND = re.compile(r"FROM \('([^']+)'\) TO \('([^']+)'\)")
_DAY_NAME = "events_p{:%Y%m%d}"


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
    return name


def ensure_ahead(engine: Engine, days_ahead: int = DAYS_AHEAD) -> list[str]:
    """Make the partitions of today (UTC, the server's clock) and the next `days_ahead` days that
    do not exist yet; the names made. Idempotent; nothing on SQLite or an unpartitioned store."""
    with engine.connect() as conn:
        if not is_partitioned(conn):
            return []
        today = conn.execute(text("SELECT (now() AT TIME ZONE 'UTC')::date")).scalar_one()
        have = {p.lo.date() for p in day_partitions(conn)}
    made = []
    for n in range(days_ahead + 1):
        day = today + dt.timedelta(days=n)
        if day not in have:
            with engine.begin() as conn:
                made.append(_make_day(conn, day))
    return made


def _run_ids_in(conn: Connection, name: str) -> list[str]:
    """The distinct run ids of one partition, by a skip scan of its (run_id, seq) index: one probe
    per run, not a read of every event."""
    q = _q(conn, name)
    return list(conn.execute(text(
        f"WITH RECURSIVE ids AS ((SELECT run_id FROM {q} ORDER BY run_id LIMIT 1) UNION ALL "
        f"SELECT (SELECT e.run_id FROM {q} e WHERE e.run_id > ids.run_id ORDER BY e.run_id LIMIT 1) "
        f"FROM ids WHERE ids.run_id IS NOT NULL) SELECT run_id FROM ids WHERE run_id IS NOT NULL")).scalars())


@dataclass
class Dropped:
    partitions: int = 0
    events: int = 0
    kept_events: int = 0  # of runs retention keeps, moved to the default partition
    longest_s: float = 0.0
    locked_s: float = 0.0  # the longest time `events` was locked against the writers (DETACH to commit)


def drop_expired(engine: Engine, cutoff: dt.datetime, prunable: ColumnElement[bool],
                 out_of_time: Callable[[], bool] = lambda: False,
                 clock: Callable[[], float] | None = None) -> Dropped:
    """Drop every day partition that ends at or before `cutoff`, each in its own transaction.
    `prunable` is retention's condition on `runs`: the events of a run it does not hold for are
    kept (moved to the default partition) and the day still goes."""
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
        with engine.begin() as conn:
            q = _q(conn, p.name)
            ids = _run_ids_in(conn, p.name)
            kept: list[str] = []
            for i in range(0, len(ids), 1000):
                chunk = ids[i:i + 1000]
                kept += conn.execute(select(runs.c.id).where(runs.c.id.in_(chunk), not_(prunable))).scalars().all()
            total = conn.execute(text(f"SELECT count(*) FROM {q}")).scalar_one()
            conn.execute(text(f"SET LOCAL lock_timeout = {LOCK_TIMEOUT_MS}"))
            t_lock = tick()  # from here to the commit the writers of events wait
            conn.execute(text(f"ALTER TABLE events DETACH PARTITION {q}"))
            if kept:
                # Its range is no partition's now: they land in the default partition.
                moved = conn.execute(text(f"INSERT INTO events SELECT * FROM {q} WHERE run_id = ANY(:ids)"),
                                     {"ids": kept}).rowcount
                done.kept_events += moved
                total -= moved
            conn.execute(text(f"DROP TABLE {q}"))
        done.locked_s = max(done.locked_s, tick() - t_lock)
        done.partitions += 1
        done.events += total
        done.longest_s = max(done.longest_s, tick() - t0)
    return done


__all__ = ["DAYS_AHEAD", "DEFAULT", "MODEL_ONLY", "PG_ONLY", "DayPartition", "Dropped", "day_partitions", "drop_expired", "ensure_ahead",
           "is_partitioned"]
