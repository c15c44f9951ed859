"""Reads of single outbox rows by dedupe key, for deciders that check what was queued before:
when an alert was queued, and a queued alert with its seal (the caller verifies the MAC: any
store writer can insert an alert row)."""

from __future__ import annotations

import datetime as dt
from typing import Any, NamedTuple

from sqlalchemy import select
from sqlalchemy.engine import Connection

from watchdog.store.schema import alerts

KEY_CHARS = 255  # alerts.dedupe_key's width: longer keys are stored cut


class SealedAlert(NamedTuple):
    """An alert row as its seal covers it (values as stored: any writer may have put them there)."""

    dedupe_key: str
    title: Any
    body: Any
    mac: Any
    created_at: dt.datetime


def queued_at(conn: Connection, key: str) -> dt.datetime | None:
    """When the alert of this dedupe key was queued; None if it never was."""
    at: dt.datetime | None = conn.execute(
        select(alerts.c.created_at).where(alerts.c.dedupe_key == key[:KEY_CHARS])).scalar()
    return at


def by_key(conn: Connection, key: str) -> SealedAlert | None:
    """The alert row of this dedupe key, with what its seal covers."""
    a = conn.execute(select(alerts.c.dedupe_key, alerts.c.title, alerts.c.body, alerts.c.mac, alerts.c.created_at)
                     .where(alerts.c.dedupe_key == key[:KEY_CHARS])).first()
    return None if a is None else SealedAlert(*a)
