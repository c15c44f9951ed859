"""The outbox's rows: claimed before they are sent, read so that one bad row cannot fail a pass.

Claims: a delivery pass marks the rows it is about to send (`claimed_by`, `claimed_until`)
in one short write transaction, so two deliverers on one store (two daemons of one host,
the service and a `run --once`) never send one alert twice. PostgreSQL: SELECT ... FOR
UPDATE SKIP LOCKED, then UPDATE, in one transaction; SQLite: the same statements under
its write lock (the engine begins writers with BEGIN IMMEDIATE). A claim ends when the
pass records its results; a crashed claimer's claims expire at `claimed_until` and are
retaken. A claim ending further ahead than any pass could set it (twice its length) is a
clock that went back: it is expired too, or a clock jump would hold the alerts.

Reads: rows are written by whoever can write the store, and another language may write
what this code never would (text in an integer column, an unparsable timestamp, invalid
JSON). The ids are read first (integers), then the rows; if the batch cannot be read,
each row is read alone, and a row that still cannot be read is reported with the column
that failed, never its content.
"""

from __future__ import annotations

import datetime as dt
import os
import uuid
from typing import Any, Iterable, NamedTuple, Sequence

from sqlalchemy import Column, and_, func, or_, select, update
from sqlalchemy.engine import Connection, Engine, Row
from sqlalchemy.exc import DBAPIError
from sqlalchemy.sql import ColumnElement

from watchdog.store.schema import alerts

_ERROR_CHARS = 2000


def claimer(host: str) -> str:
    """A token naming this pass (host, pid, and a nonce: two passes of one process differ)."""
    return f"{host}:{os.getpid()}:{uuid.uuid4().hex[:8]}"[-255:]


def lane_holder(host: str) -> str:
    """Who holds a row whose send is still running in one of this process's lanes: only this
    process's next pass takes it again (another deliverer would send it a second time)."""
    return f"{host}:{os.getpid()}:lanes"[-255:]


def _unclaimed(now: dt.datetime, ttl_s: float) -> ColumnElement[bool]:
    # Two passes read the clock a moment apart: a claim is from the future (a clock set back)
    # only beyond twice its length, never because the other pass's `now` was a little later.
    return or_(alerts.c.claimed_until.is_(None), alerts.c.claimed_until < now,
               alerts.c.claimed_until > now + dt.timedelta(seconds=2 * ttl_s))


def claim(engine: Engine, token: str, *, host: str, now: dt.datetime, ttl_s: float, expire_before: dt.datetime,
          limit: int) -> list[int]:
    """Claim up to `limit` open alerts of `host` that are due (or expired: they are to be
    dead-lettered, whatever their backoff says); the ids this pass now holds."""
    open_ = and_(alerts.c.delivered_at.is_(None), alerts.c.dead_at.is_(None),
                 or_(alerts.c.sealed_by == host, alerts.c.sealed_by.is_(None)))
    due = or_(alerts.c.next_attempt_at.is_(None), alerts.c.next_attempt_at <= now, alerts.c.created_at < expire_before)
    unclaimed = or_(_unclaimed(now, ttl_s), alerts.c.claimed_by == lane_holder(host))
    with engine.begin() as conn:
        ids = conn.execute(select(alerts.c.id).where(and_(open_, due, unclaimed)).order_by(alerts.c.id).limit(limit)
                           .with_for_update(skip_locked=True)).scalars().all()
        if not ids:
            return []
        conn.execute(update(alerts).where(and_(alerts.c.id.in_(ids), open_, unclaimed))
                     .values(claimed_by=token, claimed_until=now + dt.timedelta(seconds=ttl_s)))
        return list(conn.execute(select(alerts.c.id).where(and_(alerts.c.id.in_(ids), alerts.c.claimed_by == token))
                                 .order_by(alerts.c.id)).scalars())


def release(engine: Engine, token: str) -> None:
    """End this pass's claims that are still held (rows it could not record)."""
    with engine.begin() as conn:
        conn.execute(update(alerts).where(alerts.c.claimed_by == token).values(claimed_by=None, claimed_until=None))


def record(conn: Connection, token: str, alert_id: int, values: dict[str, Any]) -> bool:
    """Write a pass's result for one row and end its claim; False if the claim was lost
    (it expired and another pass took the row)."""
    res = conn.execute(update(alerts).where(and_(alerts.c.id == alert_id, alerts.c.claimed_by == token))
                       .values(**values, claimed_by=None, claimed_until=None))
    return bool(res.rowcount == 1)


def hold(conn: Connection, token: str, alert_id: int, values: dict[str, Any], *, host: str, until: dt.datetime) -> bool:
    """A row still being sent in a lane: its results so far, claimed for this process until
    `until` (a crashed daemon's hold expires: the promise across a crash is at least once)."""
    res = conn.execute(update(alerts).where(and_(alerts.c.id == alert_id, alerts.c.claimed_by == token))
                       .values(**values, claimed_by=lane_holder(host), claimed_until=until))
    return bool(res.rowcount == 1)


class Waiting(NamedTuple):
    """An open alert older than a pass's own, as read (any writer may have put these values)."""

    id: int
    delivered_targets: Any
    next_attempt_at: Any


def waiting_before(conn: Connection, *, host: str, below_id: int, exclude: list[int],
                   limit: int = 1000) -> list[Waiting]:
    """Open alerts of `host` older than `below_id` that this pass did not claim (in their
    backoff): (id, delivered_targets, next_attempt_at). A target gets nothing newer first."""
    q = (select(alerts.c.id, alerts.c.delivered_targets, alerts.c.next_attempt_at)
         .where(and_(alerts.c.delivered_at.is_(None), alerts.c.dead_at.is_(None), alerts.c.id < below_id,
                     or_(alerts.c.sealed_by == host, alerts.c.sealed_by.is_(None)), alerts.c.id.not_in(exclude)))
         .order_by(alerts.c.id).limit(limit))
    try:
        return [Waiting(*r) for r in conn.execute(q)]
    except DBAPIError:
        raise
    except Exception:  # noqa: BLE001 — a bad value in a row: order is not enforced past it this pass
        return []


def refuse(conn: Connection, ids: list[int], *, now: dt.datetime, reason: str) -> None:
    """Rows whose seal does not verify: closed as handled (never delivered), with why, claims ended."""
    conn.execute(update(alerts).where(alerts.c.id.in_(ids))
                 .values(delivered_at=now, last_error=reason[:_ERROR_CHARS], attempts=alerts.c.attempts + 1,
                         claimed_by=None, claimed_until=None))


def dead_letter(engine: Engine, token: str, alert_id: int, now: dt.datetime, reason: str) -> bool:
    """Kept, marked, never retried; its claim ends. Writes no column it read: a bad value
    in one of them cannot stop this."""
    with engine.begin() as conn:
        return record(conn, token, alert_id, {"dead_at": now, "last_error": reason[:_ERROR_CHARS]})


Read = tuple[int, Row[Any] | None, str | None]  # (id, the row, what failed): one of the two is None


def read(engine_or_conn: Engine | Connection, ids: list[int],
         columns: Iterable[Column[Any]] | None = None) -> list[Read]:
    """(id, row, None) for each row that reads, (id, None, what failed) for each that does not.
    A store that is down raises: only a row that fails where its neighbours read is bad."""
    cols: list[Column[Any]] = list(columns) if columns is not None else list(alerts.c)
    if alerts.c.id not in cols:
        cols.insert(0, alerts.c.id)
    try:
        with _conn(engine_or_conn) as conn:
            rows = conn.execute(select(*cols).where(alerts.c.id.in_(ids)).order_by(alerts.c.id)).all()
        return [(r.id, r, None) for r in rows]
    except Exception:  # noqa: BLE001 — one bad row; find it below
        pass
    out: list[Read] = []
    for alert_id in ids:
        try:
            with _conn(engine_or_conn) as conn:
                row = conn.execute(select(*cols).where(alerts.c.id == alert_id)).first()
        except Exception as exc:  # noqa: BLE001
            out.append((alert_id, None, _what_failed(engine_or_conn, alert_id, cols, exc)))
            continue
        if row is not None:
            out.append((alert_id, row, None))
    return out


def _what_failed(engine_or_conn: Engine | Connection, alert_id: int, cols: Sequence[Column[Any]],
                 exc: Exception) -> str:
    bad = []
    for col in cols:
        try:
            with _conn(engine_or_conn) as conn:
                conn.execute(select(col).where(alerts.c.id == alert_id)).first()
        except DBAPIError as col_exc:
            if col is alerts.c.id:  # even the id does not read: the store is in trouble, not the row
                raise col_exc from exc
            bad.append(f"{col.name} ({type(col_exc.orig).__name__})")
        except Exception as col_exc:  # noqa: BLE001 — the value is the store's, never repeated
            bad.append(f"{col.name} ({type(col_exc).__name__})")
    return "unreadable row: " + (", ".join(bad) if bad else type(exc).__name__) + " cannot be read"


class _conn:
    """A connection of its own from an engine (a failed read leaves nothing behind), or the
    caller's connection as is (the CLI's one read snapshot)."""

    def __init__(self, engine_or_conn: Engine | Connection) -> None:
        self._src = engine_or_conn
        self._mine: Connection | None = None

    def __enter__(self) -> Connection:
        if isinstance(self._src, Engine):
            self._mine = self._src.connect()
            return self._mine
        return self._src

    def __exit__(self, *exc: object) -> None:
        if self._mine is not None:
            self._mine.close()


def problem(row: Any) -> str | None:
    """What makes a readable row unusable, by column and type (never its value), or None."""
    checks = (
        ("dedupe_key", lambda v: isinstance(v, str) and v != "", "a non-empty string"),
        ("title", lambda v: isinstance(v, str), "text"),
        ("body", lambda v: isinstance(v, str), "text"),
        ("attempts", lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 0, "an integer >= 0"),
        ("delivered_targets", lambda v: v is None or (isinstance(v, list) and all(isinstance(t, str) for t in v)),
         "a JSON list of target ids"),
        ("created_at", lambda v: isinstance(v, dt.datetime), "a timestamp"),
        ("next_attempt_at", lambda v: v is None or isinstance(v, dt.datetime), "a timestamp"),
    )
    bad = [f"{name} is {_kind(getattr(row, name))}, not {want}" for name, ok, want in checks if not ok(getattr(row, name))]
    return "unusable row: " + "; ".join(bad) if bad else None


def _kind(value: object) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, list):
        return "a list with a non-string item"
    if isinstance(value, int) and not isinstance(value, bool) and value < 0:
        return "negative"
    return type(value).__name__


LISTED = ("dedupe_key", "run_id", "created_at", "attempts", "next_attempt_at", "dead_at", "delivered_targets",
          "last_error", "title")


def undelivered(conn: Connection, *, dead_only: bool, limit: int) -> tuple[list[dict[str, Any]], int]:
    """The alerts not delivered (waiting or dead letters), oldest first, as plain values for
    a listing; a row that cannot be read is listed by its id with what failed. And how many
    more there are beyond `limit`."""
    which = alerts.c.dead_at.is_not(None) if dead_only else alerts.c.delivered_at.is_(None)
    light = conn.execute(select(alerts.c.id, alerts.c.dead_at.is_not(None).label("dead")).where(which)
                         .order_by(alerts.c.id).limit(limit)).all()
    total = conn.execute(select(func.count()).select_from(alerts).where(which)).scalar_one()
    dead = {r.id: bool(r.dead) for r in light}
    out = []
    for alert_id, row, unreadable in read(conn, [r.id for r in light], [alerts.c[c] for c in LISTED]):
        record: dict[str, Any] = {"id": alert_id, "state": "dead" if dead.get(alert_id) else "waiting"}
        if row is None:
            record.update({c: None for c in LISTED}, last_error=unreadable)
        else:
            record.update({c: getattr(row, c) for c in LISTED})
        out.append(record)
    return out, max(0, total - len(out))


HISTORY = ("dedupe_key", "run_id", "created_at", "attempts", "delivered_at", "dead_at", "delivered_targets",
           "last_error", "title")


def history(conn: Connection, *, limit: int) -> tuple[list[dict[str, Any]], int]:
    """Every alert, newest first (`alerts --all`), with its state and, per target, when it was
    recorded as delivered (`at:<target>:<time>` entries of delivered_targets); and how many more."""
    ids = [r for (r,) in conn.execute(select(alerts.c.id).order_by(alerts.c.id.desc()).limit(limit))]
    total = conn.execute(select(func.count()).select_from(alerts)).scalar_one()
    out = []
    for alert_id, row, unreadable in sorted(read(conn, ids, [alerts.c[c] for c in HISTORY]), key=lambda x: -x[0]):
        record: dict[str, Any] = {"id": alert_id}
        if row is None:
            record.update({c: None for c in HISTORY}, state="unreadable", last_error=unreadable, targets={})
            out.append(record)
            continue
        record.update({c: getattr(row, c) for c in HISTORY})
        done = row.delivered_targets if isinstance(row.delivered_targets, list) else []
        targets: dict[str, str] = {}
        for entry in done:
            if not isinstance(entry, str):
                continue
            if entry.startswith("at:") and entry.count(":") >= 2:
                _, tid, when = entry.split(":", 2)  # a target id has no colon; the time has
                targets[tid] = when
            elif entry.startswith("dead:"):
                targets.setdefault(entry[5:], "dead")
            else:
                targets.setdefault(entry, "delivered")
        record["targets"] = targets
        last = row.last_error if isinstance(row.last_error, str) else ""
        if row.dead_at is not None:
            record["state"] = "dead"
        elif row.delivered_at is None:
            record["state"] = "waiting"
        elif last.startswith("summarised in "):
            record["state"] = "summarised"
        elif last.startswith("refused"):
            record["state"] = "refused"
        elif not targets:
            record["state"] = "logged"  # no target configured: only the daemon's log has it
        else:
            record["state"] = "delivered"
        out.append(record)
    return out, max(0, total - len(out))
