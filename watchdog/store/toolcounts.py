"""Every run's new tool calls grouped by tool, computed by PostgreSQL (issue 35, the sharded leader).

The leader's store-wide duties (the circuits, the all-runs tool rate, the money's unpriced
steps: watchdog.daemon.tick.toolwatch) read every run's new events, ~1,000 a tick at 100,000
active runs. Read as rows (watchdog.store.scan.calls_above) each one was five typed columns
for Python to build, a datetime among them. Here the database groups them: one row per (kind,
tool) with the ids it read (the late-commit window needs them), the calls' times as epoch
seconds, whether any failed and the steps without a cost, in arrays. The rows the leader reads
are O(tools), the arrays' integers and floats parse in the driver's C loader.

The same events as calls_above (the folded kinds, above the mark) plus those of `late` (ids
below the mark committed since: watchdog.daemon.trust.latewindow), in one statement;
`grouped_calls_and_window` sends it with the late window's check (watchdog.store.scan.
folded_sum_between, store-wide) in one round trip, the check first in the same snapshot.
PostgreSQL only: judges are sharded there.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from watchdog.core import lifecycle as lc
from watchdog.store import dialects
from watchdog.store.engine import Connection
from watchdog.store.scan import FOLDED, WindowSum

__all__ = ["CallGroup", "grouped_calls", "grouped_calls_and_window"]


class CallGroup(NamedTuple):
    """The new events of one (kind, tool): a tool's calls, or the steps (tool None)."""

    kind: str
    tool: str | None
    ids: list[int]  # every event id read, in no particular order
    at_s: list[float]  # a tool call's time (epoch s) each, in id order; empty for steps
    failed: bool  # a call of this tool failed (ok is false)
    unpriced: list[int]  # the steps without a cost (for the money's backfill)


_KINDS = ", ".join(f"'{k}'" for k in FOLDED)
assert all(k.isidentifier() for k in FOLDED)
_GROUPED = (
    "SELECT kind, tool, array_agg(id), "
    f"coalesce(array_agg(extract(epoch FROM at)::float8 ORDER BY id) FILTER (WHERE kind = '{lc.EV_TOOL}'), "
    "'{}'), coalesce(bool_or(ok IS false), false), "
    f"coalesce(array_agg(id) FILTER (WHERE kind = '{lc.EV_STEP}' AND cost_eur IS NULL), '{{}}') "
    f"FROM events WHERE kind IN ({_KINDS}) AND (id > %s OR id = ANY(%s::bigint[])) GROUP BY kind, tool")


# folded_sum_between's PostgreSQL answer, store-wide, as the driver's own statement
_WINDOW = ("SELECT count(*), coalesce(sum(id), 0), pg_snapshot_xmin(pg_current_snapshot())::text, "
           f"pg_current_xact_id()::text FROM events WHERE kind IN ({_KINDS}) AND id > %s AND id <= %s")


def _pg(conn: Connection) -> None:
    if conn.dialect.name != "postgresql":
        raise ValueError("grouped calls: PostgreSQL only (sharded judges)")


def _groups(rows: list[Any]) -> list[CallGroup]:
    return [CallGroup(str(kind), tool if tool.__class__ is str else None, list(ids), list(at_s), bool(failed),
                      list(unpriced)) for kind, tool, ids, at_s, failed, unpriced in rows]


def grouped_calls(conn: Connection, above: int, late: list[int] | None = None) -> list[CallGroup]:
    """Every run's folded events with an id above `above`, or among `late`, grouped by kind and tool."""
    _pg(conn)
    return _groups(list(conn.exec_driver_sql(_GROUPED, (above, list(late or ()))).all()))


def grouped_calls_and_window(conn: Connection, above: int, low: int) -> tuple[list[CallGroup], WindowSum]:
    """(grouped_calls above `above`, folded_sum_between(low, above) of every run), one round trip."""
    _pg(conn)
    window, grouped = dialects.of(conn).read_batch(conn, [(_WINDOW, (low, above)), (_GROUPED, (above, []))])
    n, total, xmin, xid_bound = window[0]
    return _groups(grouped), WindowSum(int(n), int(total), int(xmin), int(xid_bound))
