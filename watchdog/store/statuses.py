"""The writer of `runs.status` for the daemon, the CLI and the gateways (the SDK's pre-rendered
hot statements in agent_writes and lineage make their few fixed moves themselves): every move
is checked against `lifecycle.STATUS_MOVES` before anything is written, and is a compare-and-set on the
status (or statuses) the caller expects, so two writers never make the same move twice.

A move the table does not list raises IllegalStatusMove (a bug in the caller, never a
condition of the data). The transaction is the caller's.
"""

from __future__ import annotations

from typing import Any, Iterable

from sqlalchemy import and_, update
from sqlalchemy.engine import Connection
from sqlalchemy.sql.elements import ColumnElement

from watchdog.core import lifecycle as lc
from watchdog.core.lifecycle import IllegalStatusMove
from watchdog.store.schema import runs

IllegalMove = IllegalStatusMove  # the name callers of this module catch in tests


def move(conn: Connection, run_id: str, to: lc.Status, *, was: lc.Status | Iterable[lc.Status],
         when: ColumnElement[bool] | None = None, **values: Any) -> bool:
    """was -> to for one run, writing `values` with it; False when the run is not (any more)
    in `was` (or `when`, a further condition on its row, does not hold)."""
    froms = (was,) if isinstance(was, str) else tuple(was)
    for current in froms:
        lc.check_status_move(current, to)
    cond = runs.c.status == froms[0] if len(froms) == 1 else runs.c.status.in_(froms)
    if when is not None:
        cond = and_(cond, when)
    res = conn.execute(update(runs).where(and_(runs.c.id == run_id, cond)).values(status=to, **values))
    return bool(res.rowcount == 1)
