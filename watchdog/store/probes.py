"""The two writes the SDK makes on a tool's circuit: claim the half-open probe, and close the
circuit when that probe succeeded. Both are conditional UPDATEs, so of any number of callers
in any number of processes exactly one wins (the rest of the circuits' SQL is the daemon's)."""

from __future__ import annotations

import datetime as dt

from sqlalchemy import and_, or_, select, update
from sqlalchemy.engine import Engine

from watchdog.core.lifecycle import Circuit
from watchdog.store.schema import tool_circuits as t


def claim_probe(engine: Engine, tool: str, run_id: str, now: dt.datetime) -> tuple[bool, str | None]:
    """(won, the circuit's state when lost: None if the row is gone)."""
    claim = (
        update(t)
        .where(t.c.tool == tool,
               or_(and_(t.c.state == Circuit.OPEN, t.c.open_until <= now),
                   and_(t.c.state == Circuit.HALF_OPEN, t.c.probe_run_id.is_(None))))
        .values(state=Circuit.HALF_OPEN, probe_run_id=run_id, probe_at=now, updated_at=now)
    )
    with engine.begin() as conn:
        if conn.execute(claim).rowcount == 1:
            return True, Circuit.HALF_OPEN
        return False, conn.execute(select(t.c.state).where(t.c.tool == tool)).scalar()


def close_after_probe(engine: Engine, tool: str, run_id: str, now: dt.datetime) -> bool:
    """Close the circuit if it is still half-open with this run's probe. The probe's id stays
    on the row for the daemon to audit the close."""
    with engine.begin() as conn:
        return conn.execute(
            update(t).where(t.c.tool == tool, t.c.state == Circuit.HALF_OPEN, t.c.probe_run_id == run_id)
            .values(state=Circuit.CLOSED, open_until=None, errors_in_window=0, updated_at=now)).rowcount == 1
