"""The `settings` table: what the daemon publishes so the SDK, the daemon and the CLI agree.

One row per key, the value JSON. The keys are the table contract's, spelled here once:
`config` (the profiles and the price table, watchdog.core.config.Config.published),
`budget_closed` and `budget_state` (the period budgets, watchdog.core.periods). Only the
daemon writes them (on PostgreSQL the agents' role cannot); the SDK reads `config` and
`budget_closed` through its pre-rendered statement (watchdog.store.agent_writes).
"""

from __future__ import annotations

import datetime as dt
from typing import Any, NamedTuple

from sqlalchemy import insert, select, update
from sqlalchemy.engine import Connection

from watchdog.core.periods import CLOSED_KEY, STATE_KEY
from watchdog.store.schema import settings

CONFIG_KEY = "config"
__all__ = ["CONFIG_KEY", "CLOSED_KEY", "STATE_KEY", "Published", "get", "get_with_time", "put"]


class Published(NamedTuple):
    value: Any
    updated_at: dt.datetime | None


def put(conn: Connection, key: str, value: Any, now: dt.datetime) -> None:
    """Publish `value` under `key` (an update, else an insert)."""
    done = conn.execute(update(settings).where(settings.c.key == key).values(value=value, updated_at=now))
    if done.rowcount == 0:
        conn.execute(insert(settings).values(key=key, value=value, updated_at=now))


def get(conn: Connection, key: str) -> Any:
    """The published value, None when nothing is published under `key`."""
    return conn.execute(select(settings.c.value).where(settings.c.key == key)).scalar()


def get_with_time(conn: Connection, key: str) -> Published | None:
    """The published value and when it was published; None when nothing is."""
    row = conn.execute(select(settings.c.value, settings.c.updated_at).where(settings.c.key == key)).first()
    return None if row is None else Published(row.value, row.updated_at)
