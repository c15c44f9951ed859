"""The SQL `agent-watchdog exec` reads of its own run: what the daemon decided about it, and
whether the command reported anything itself (its own records, a child run's roll-up, spans).

Rendered once per dialect (the SDK's write path, watchdog.store.agent_writes, runs it)."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

from sqlalchemy.engine import Connection

from watchdog.core import lifecycle as lc
from watchdog.store.dialects import Dialect
from watchdog.store.lineage import Writer

STATE_COLUMNS = ("status", "stop_reason", "stop_detail", "steps", "tool_calls", "last_seen_at")


@dataclass(frozen=True)
class ExecRunState:
    status: str
    stop_reason: str | None
    stop_detail: str | None
    steps: int
    tool_calls: int
    last_seen_at: object  # compared for change only: text on SQLite, a datetime on PostgreSQL


@functools.cache
def state_sql(dialect: Dialect) -> str:
    ph = dialect.ph
    return f"SELECT {', '.join(STATE_COLUMNS)} FROM runs WHERE id = {ph}"


def read_state(writer: Writer, run_id: str) -> ExecRunState | None:
    """The run's row as exec needs it, or None when it is not there (deleted under us)."""
    rows = writer.query(state_sql(writer.dialect), (run_id,))
    if not rows:
        return None
    status, reason, detail, steps, calls, seen = rows[0][:6]
    return ExecRunState(str(status), reason, detail, int(steps or 0), int(calls or 0), seen)


def active_exec_roots(conn: Connection, host: str, kill_mode: str) -> list[tuple[str, int, float]]:
    """(run id, pid, create time) of this host's active exec'd runs of `kill_mode` (the daemon
    remembers their trees: watchdog.daemon.stops.runtree.TreeMemory). Candidates only: what the
    daemon acts on is checked against the sealed attestation."""
    from sqlalchemy import and_, select

    from watchdog.store.schema import runs

    q = select(runs.c.id, runs.c.pid, runs.c.pid_create_time).where(and_(
        runs.c.status.in_(list(lc.ACTIVE_STATUSES)), runs.c.host == host, runs.c.source == lc.Source.EXEC.value,
        runs.c.kill_mode == kill_mode))
    return [(r.id, r.pid, r.pid_create_time) for r in conn.execute(q)]


@functools.cache
def _killed_child_sql(dialect: Dialect) -> str:
    return (f"SELECT stop_reason, stop_detail FROM runs WHERE parent_id = {dialect.ph} AND status = '{lc.KILLED}' "
            f"AND stop_reason IS NOT NULL ORDER BY ended_at DESC LIMIT 1")


def killed_child(writer: Writer, run_id: str) -> tuple[str, str | None] | None:
    """(stop reason, detail) of a child run of `run_id` that was stopped (an in-process guard of
    the SDK inside exec's command, holding it to exec's run's budgets), or None."""
    rows: list[Any] = writer.query(_killed_child_sql(writer.dialect), (run_id,))
    if not rows:
        return None
    reason, detail = rows[0][:2]
    return str(reason), detail
