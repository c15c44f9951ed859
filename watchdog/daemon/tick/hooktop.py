"""The top tool of a coding CLI's hook run, with the errors its hook appended after the calls.

The hook counts a call before it runs (a tool event, ok unknown) and appends its failure as a
result afterwards (watchdog.store.hooks.count_failed): the fold reads the calls, not the results,
so the tool it names for a hook run has no errors. When the run's error counter says there are
more errors than the fold attributed, the alert's top tool is read from the run's events (the
same read as `runs` / `show` and the acknowledged stop's alert), once per change of the counters.
"""

from __future__ import annotations

from typing import Any

from watchdog.core import lifecycle as lc
from watchdog.store import read_connection, run_rows

Top = tuple[str, int, int]
KEPT = 10_000  # runs remembered, at most (forgotten all at once past it: a read each, again)


class HookTops:
    def __init__(self) -> None:
        self._seen: dict[str, tuple[tuple[int, int], Top | None]] = {}

    def top(self, engine: Any, row: Any, folded: Top | None, folded_errors: int) -> Top | None:
        """`folded` (the fold's top tool), or for a hook run with errors the fold did not
        attribute, the store's (None read: `folded`)."""
        errors = row.tool_errors if isinstance(row.tool_errors, int) else 0
        if row.source != lc.Source.HOOK or errors <= folded_errors:
            return folded
        key = (int(row.tool_calls or 0), errors)
        hit = self._seen.get(row.id)
        if hit is not None and hit[0] == key:
            return hit[1] or folded
        with read_connection(engine) as conn:
            got = run_rows.top_tool(conn, row.id)
        if len(self._seen) >= KEPT:
            self._seen.clear()
        top = (got.name, got.calls, got.errors) if got is not None else None
        self._seen[row.id] = (key, top)
        return top or folded
