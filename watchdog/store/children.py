"""Child runs in the store: a run's descendants, its lock order, the child that spent most.

A child's steps, tool calls and spend are added to its ancestors' rows by the SDK in
the child's own record transaction (watchdog.sdk.children), so the daemon judges a
parent on its totals without reading its children. What is here runs only when a run
is stopped (watchdog.store.stops.stop_children) or shown.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from sqlalchemy import and_, desc, literal, select
from sqlalchemy.engine import Connection

from watchdog.core.messages import RunFacts
from watchdog.store.rows import RunRow
from watchdog.store.schema import runs, WHOLE_RUN

MAX_DEPTH = 32  # a parent_id chain (or cycle, in a row written by hand) is never followed further


def descendants(conn: Connection, run_id: str) -> list[RunRow]:
    """Every run below `run_id` (children, grandchildren...), each once, cycles cut."""
    tree = select(runs.c.id, literal(1).label("depth")).where(runs.c.parent_id == run_id).cte("tree", recursive=True)
    tree = tree.union(select(runs.c.id, (tree.c.depth + 1).label("depth"))
                      .where(and_(runs.c.parent_id == tree.c.id, tree.c.depth < MAX_DEPTH)))
    ids = set(conn.execute(select(tree.c.id)).scalars()) - {run_id}
    if not ids:
        return []
    rows = conn.execute(select(*WHOLE_RUN).where(runs.c.id.in_(sorted(ids))))
    return [RunRow.from_mapping(r._mapping) for r in rows]


def lock_family(conn: Connection, run_id: str) -> None:
    """PostgreSQL: lock the run's descendants, deepest first, before the run itself is written.
    An agent's record locks its own run, then its ancestors (the roll-up); a stop that wrote the
    parent first, then its children, would lock them the other way round: a deadlock."""
    if conn.dialect.name != "postgresql":
        return  # SQLite: one writer at a time
    tree = select(runs.c.id, literal(1).label("depth")).where(runs.c.parent_id == run_id).cte("tree", recursive=True)
    tree = tree.union(select(runs.c.id, (tree.c.depth + 1).label("depth"))
                      .where(and_(runs.c.parent_id == tree.c.id, tree.c.depth < MAX_DEPTH)))
    deepest: dict[str, int] = {}
    for rid, depth in conn.execute(select(tree.c.id, tree.c.depth)):
        deepest[rid] = max(depth, deepest.get(rid, 0))
    for rid in sorted(deepest, key=lambda r: (-deepest[r], r)):
        if rid != run_id:
            conn.execute(select(runs.c.id).where(runs.c.id == rid).with_for_update())


def children_of(conn: Connection, run_id: str) -> list[RunRow]:
    """The direct children of a run, oldest first."""
    return [RunRow.from_mapping(r._mapping) for r in conn.execute(
        select(*WHOLE_RUN).where(runs.c.parent_id == run_id).order_by(runs.c.started_at, runs.c.id))]


def child_line(child: RunRow) -> str:
    outcome = child.status + (f" ({child.stop_reason})" if child.stop_reason else "")
    return (f"{child.agent} run {child.id[:8]}: {child.cost_eur:.4f} EUR, {child.steps} steps, "
            f"{child.tool_calls} tool calls, {outcome}")


def with_top_child(conn: Connection, row: Any, f: RunFacts) -> RunFacts:
    """The facts of a parent run with its child that spent most (money, then steps) named."""
    top = conn.execute(select(*WHOLE_RUN).where(runs.c.parent_id == row.id)
                       .order_by(desc(runs.c.cost_eur), desc(runs.c.steps), desc(runs.c.tool_calls)).limit(1)).first()
    return dataclasses.replace(f, top_child=child_line(RunRow.from_mapping(top._mapping))) if top is not None else f
