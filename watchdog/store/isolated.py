"""Reading rows anyone may have written by hand: one bad row or event costs only itself.

The tick reads runs, events and steps in chunks; a value that does not parse (a timestamp
written as 'garbage', labels that are not JSON, a year-20000 date PostgreSQL accepts and
Python does not) fails the whole chunk. Here a failed chunk is read again key by key, and
what still fails becomes a Defect, which the tick reports once (watchdog.daemon.trust.quarantine).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from sqlalchemy import Table, select
from sqlalchemy.engine import Connection, Row
from sqlalchemy.exc import OperationalError
from sqlalchemy.sql import ColumnElement, Executable

from watchdog.store import dialects
from watchdog.store.engine import store_unavailable
from watchdog.store.schema import events

CHUNK = 500
SUSPECTS_MAX = 10_000  # a flood of bad rows costs chunk re-reads, never memory


@dataclass(frozen=True)
class Defect:
    """A run or event the tick could not read or judge: it costs only itself (quarantine.py
    reports it once). `detail` is the daemon's own words (a column and what it holds), never
    the stored value: any store writer chooses that text."""

    run_id: str | None
    detail: str
    event_id: int | None = None


class _Savepoints:
    always = False  # this process met a read the server itself failed: savepoints from then on


@contextmanager
def chunk_read(conn: Connection) -> Iterator[None]:
    """Around one read of rows that may hold a bad value, so that its failure leaves the
    snapshot usable for the reads after it. Where such a failure happens in the driver
    (Dialect.reads_fail_in_driver), no SAVEPOINT and RELEASE round trips around every read:
    should the server fail one after all (its transaction then refuses every later statement),
    that is raised as an outage (the tick is retried) and this process uses savepoints from then on."""
    if not dialects.of(conn).reads_fail_in_driver or _Savepoints.always:
        with conn.begin_nested():
            yield
        return
    try:
        yield
    except Exception as exc:
        if not store_unavailable(exc) and dialects.of(conn).transaction_failed(conn):
            _Savepoints.always = True
            raise OperationalError("a chunk read the server failed", None, exc) from exc
        raise


def _probe(conn: Connection, table: Table, key_col: ColumnElement[Any], key: Any, cols: Sequence[str]) -> str:
    """Which columns of one row cannot be read (the row already failed as a whole)."""
    bad = []
    for c in cols:
        try:
            with conn.begin_nested():
                conn.execute(select(table.c[c]).where(key_col == key)).all()
        except Exception as exc:  # noqa: BLE001 — any failure names the column
            if store_unavailable(exc):
                raise
            bad.append(c)
    what = ", ".join(bad) if bad else "the row"
    return f"{what} cannot be read (not valid for its type)"


def read_isolated(conn: Connection, query_for: Callable[[list[Any]], Executable], keys: list[Any], *,
                  table: Table, key_col: ColumnElement[Any], defects: list[Defect], suspects: dict[Any, str],
                  event: bool = False) -> list[Row[Any]]:
    """`query_for(chunk of keys)` for every chunk; a chunk that fails to read (one value that
    does not parse) is read again key by key, and a key that still fails becomes a Defect:
    one bad row never hides the others. Each read is its own SAVEPOINT, so a failed one
    leaves the snapshot usable on PostgreSQL.

    `suspects` (key -> what was wrong), kept by the caller across ticks: the keys that failed
    last time are read on their own, so a bad row that stays costs one query per tick and
    never fails (and re-reads) its chunk again; one that was fixed reads normally."""
    out: list[Row[Any]] = []
    alone = [k for k in keys if k in suspects]
    rest = [k for k in keys if k not in suspects] if alone else keys
    failed_now: dict[Any, str] = {}

    def one(key: Any) -> None:
        try:
            with conn.begin_nested():
                out.extend(conn.execute(query_for([key])).all())
            return
        except Exception as exc:  # noqa: BLE001
            if store_unavailable(exc):
                raise
        detail = suspects.get(key) or _probe(conn, table, key_col, key, [c.name for c in table.c])
        failed_now[key] = detail
        if event:
            rid = conn.execute(select(events.c.run_id).where(events.c.id == key)).scalar()
            defects.append(Defect(rid if isinstance(rid, str) else None, f"event {key}: {detail}", key))
        else:
            defects.append(Defect(key, detail))

    for key in alone:
        one(key)
    for i in range(0, len(rest), CHUNK):
        part = rest[i : i + CHUNK]
        try:
            with chunk_read(conn):
                out.extend(conn.execute(query_for(part)).all())
            continue
        except Exception as exc:  # noqa: BLE001
            if store_unavailable(exc):
                raise
        for key in part:
            one(key)
    for key in alone:
        if key not in failed_now:
            del suspects[key]  # fixed
    suspects.update(failed_now)
    if len(suspects) > SUSPECTS_MAX:
        suspects.clear()
    return out
