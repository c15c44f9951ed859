"""The stop ladder's stage from the daemon's own record, not the row's `signal_stage` (issue 20).

A runaway that writes `signal_stage = 'done'` (or 'refused', 'not_signalled') into its row
would never be SIGTERMed: the ladder reads the stage to know its next step. The daemon
keeps each stage it reached in its state file (watchdog.store.memory); before the ladder
looks at a stopping run, a row whose stage differs is put back to the daemon's. A state
file that was lost restarts the ladder from the cooperative stop: at worst one more SIGTERM.
"""

from __future__ import annotations

import datetime as dt
import logging

from watchdog.core.rowviews import RunView
from watchdog.store import run_rows
from watchdog.store.engine import Connection
from watchdog.store.memory import Memory

log = logging.getLogger("watchdog.tick")

# (the last stage the daemon reached, when), or (None, None): none yet.
OwnStage = tuple[str | None, dt.datetime | None]


def own_stage(memory: Memory, run_id: str) -> OwnStage:
    """(stage or None, when) of the last stage the daemon reached for this run."""
    stages = memory.stages(run_id)
    if not stages:
        return None, None
    stage, at_s = max(stages.items(), key=lambda kv: kv[1])
    return stage, dt.datetime.fromtimestamp(at_s, dt.timezone.utc)


def differs(row: RunView, own: OwnStage) -> bool:
    return (row.signal_stage or None) != own[0]


def restore(conn: Connection, row: RunView, own: OwnStage) -> RunView:
    """The row with the daemon's stage written back; returns the row read again."""
    log.warning("run %s: its signal_stage %r is not the stage this daemon reached (%r): put back",
                row.id[:8], str(row.signal_stage)[:20], own[0])
    run_rows.restore_stage(conn, row.id, own[0], own[1])
    return run_rows.run_row(conn, row.id) or row


def remember(conn: Connection, memory: Memory, row: RunView, before: str | None) -> None:
    """After the ladder acted in `conn`'s transaction: record the stage it reached."""
    now = run_rows.stage_of(conn, row.id)
    if now is None or now.signal_stage is None or now.signal_stage == before:
        return
    at = now.signalled_at
    at_s = at.timestamp() if isinstance(at, dt.datetime) else dt.datetime.now(dt.timezone.utc).timestamp()
    stages = memory.stages(row.id)
    memory.reached(row.id, str(now.signal_stage), max([at_s, *(v + 1e-6 for v in stages.values())]))
