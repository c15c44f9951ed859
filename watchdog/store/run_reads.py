"""The tick's small reads of one run's rows: its labels, its stop's alert and audit row.

The Ticker and Money speak no SQL (issue 21): these are their statements, named. Each
runs on the caller's connection — inside the tick's read snapshot, or inside the write
transaction that holds SQLite's lock (a second connection would wait for it).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator, Sequence
from typing import Any, NamedTuple

from sqlalchemy import Text, bindparam, cast, select
from sqlalchemy.engine import Connection

from watchdog.store.alerts import stop_key
from watchdog.store.ledger import parse_labels
from watchdog.store.rows import RunRow
from watchdog.store.schema import alerts, runs

CHUNK = 500  # ids per IN (...): well under every backend's bound-parameter limit


class RunLabels(NamedTuple):
    run_id: str
    labels: dict[str, Any] | None  # None when the stored value is not a JSON object


class RunOwner(NamedTuple):
    """Who inserted a run (PostgreSQL's login; None on SQLite) and which witness created it."""

    owner: str | None
    source: str | None


class StopAlert(NamedTuple):
    """A run's `stop:<id>` alert as its seal covers it (watchdog.core.seal.Sealer.alert_ok)."""

    dedupe_key: str
    title: Any  # text, or whatever a hand-written row holds: the seal check says
    body: Any
    mac: Any
    created_at: dt.datetime | None


def labels_of(conn: Connection, run_ids: Sequence[str]) -> Iterator[RunLabels]:
    """The labels of these runs, read as text and parsed here: the JSON type would fail the
    whole read on one hand-written value."""
    for i in range(0, len(run_ids), CHUNK):
        for rid, raw in conn.execute(_LABELS, {"ids": list(run_ids[i : i + CHUNK])}):
            yield RunLabels(rid, parse_labels(raw))


# Built once (the money work reads the labels of the runs first seen on every tick that saw one).
_LABELS = select(runs.c.id, cast(runs.c.labels, Text)).where(runs.c.id.in_(bindparam("ids", expanding=True)))


def stop_alert(conn: Connection, run_id: str) -> StopAlert | None:
    """The run's stop alert (`stop:<run id>`), or None when none is queued."""
    a = conn.execute(select(alerts.c.dedupe_key, alerts.c.title, alerts.c.body, alerts.c.mac, alerts.c.created_at)
                     .where(alerts.c.dedupe_key == stop_key(run_id))).first()
    return None if a is None else StopAlert(a.dedupe_key, a.title, a.body, a.mac, a.created_at)



def redrive_alerts(conn: Connection, run_id: str, limit: int = 5) -> list[StopAlert]:
    """The run's `redrive:<id>:<time>` alerts (an operator's `kill` of a run already stopping),
    newest first; the caller verifies each one's seal."""
    rows = conn.execute(select(alerts.c.dedupe_key, alerts.c.title, alerts.c.body, alerts.c.mac, alerts.c.created_at)
                        .where(alerts.c.run_id == run_id, alerts.c.dedupe_key.startswith(f"redrive:{run_id}:"))
                        .order_by(alerts.c.id.desc()).limit(limit))
    return [StopAlert(a.dedupe_key, a.title, a.body, a.mac, a.created_at) for a in rows]
_OWNERS = select(runs.c.id, runs.c.owner, runs.c.source).where(runs.c.id.in_(bindparam("b_ids", expanding=True)))


def owners_of(conn: Connection, run_ids: Sequence[str]) -> dict[str, RunOwner]:
    """run id -> (its `owner` column, its `source`): PostgreSQL's owner is the login that
    inserted it (NULL on SQLite); the source, the witness that created it."""
    out: dict[str, RunOwner] = {}
    for i in range(0, len(run_ids), 500):
        out.update((rid, RunOwner(owner, source))
                   for rid, owner, source in conn.execute(_OWNERS, {"b_ids": list(run_ids[i:i + 500])}))
    return out


def whole_run(conn: Connection, run_id: str) -> RunRow | None:
    """One run's whole row (its free text bounded), or None."""
    from watchdog.store.schema import WHOLE_RUN

    row = conn.execute(select(*WHOLE_RUN).where(runs.c.id == run_id)).first()
    return None if row is None else RunRow.from_mapping(row._mapping)
