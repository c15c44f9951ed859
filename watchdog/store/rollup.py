"""Sealing ended runs: their top tool is written on the run row once, so listing
ended runs (`runs --all`) reads rows from an index and never aggregates events.

Whoever ended the run (the SDK, the daemon's ladder, another language's plain
SQL), the leader seals it a tick later: one place covers every writer. Until
then `views.list_runs` computes the top tool from the events, as before.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import and_, bindparam, select, update
from sqlalchemy.engine import Engine
from sqlalchemy.sql.elements import ColumnElement

from watchdog.store import dialects
from watchdog.store.engine import read_connection
from watchdog.store.schema import runs
from watchdog.store.views import tool_stats

SEAL_BATCH = 500


def unsealed() -> ColumnElement[bool]:
    # Spelled as the partial index ix_runs_unsealed's predicate, so both databases use it.
    return and_(runs.c.ended_at.is_not(None), runs.c.top_tool_calls.is_(None))


def seal_ended(engine: Engine, limit: int = SEAL_BATCH) -> int:
    """Seal up to `limit` ended runs (the oldest first); returns how many."""
    with read_connection(engine) as conn:
        ids = conn.execute(select(runs.c.id).where(unsealed()).order_by(runs.c.ended_at).limit(limit)).scalars().all()
        if not ids:
            return 0
        stats = tool_stats(conn, ids)
    params: list[dict[str, Any]] = []
    for rid in ids:
        top = stats[rid][0] if stats[rid] else None
        params.append({"rid": rid, "b_tool": top.name if top else None, "b_calls": top.calls if top else 0,
                       "b_errors": top.errors if top else 0})
    with engine.begin() as conn:
        # What is written here is read back from the events whenever it is missing (the partial
        # index finds the run unsealed again): a commit that a database crash loses costs a re-seal,
        # so it does not wait for the log flush (an fsync each tick that runs ended).
        dialects.of(conn).commit_without_flush(conn)
        conn.execute(update(runs).where(and_(runs.c.id == bindparam("rid"), runs.c.top_tool_calls.is_(None)))
                     .values(top_tool=bindparam("b_tool"), top_tool_calls=bindparam("b_calls"),
                             top_tool_errors=bindparam("b_errors")), params)
    return len(ids)
