"""The reads the quarantine of malformed rows makes before it records one (its writes are an
intervention and an alert: watchdog.store.interventions, watchdog.store.alerts)."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.engine import Connection

from watchdog.store.schema import interventions, runs


def recorded(conn: Connection, run_id: str, *, action: str, reason: str) -> bool:
    """The run has an intervention of this action and reason (a quarantine recorded before)."""
    return conn.execute(select(interventions.c.id).where(
        interventions.c.run_id == run_id, interventions.c.action == action,
        interventions.c.reason == reason).limit(1)).first() is not None


def run_exists(conn: Connection, run_id: str) -> bool:
    """A row of `runs` has this id (the foreign keys accept no other)."""
    return conn.execute(select(runs.c.id).where(runs.c.id == run_id)).first() is not None
