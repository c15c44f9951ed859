"""The leader's store-wide tool calls when judges are sharded (issue 35).

The circuits (errors per tool across runs) and the all-runs tool rate are the leader's duties
and need every run's tool calls. Before sharding the leader folded every event for them (the
Scanner's whole rows, its tallies and evidence); a sharded leader folds only its Reach's, like
any judge, and reads here the five columns those two duties use of every folded event: id, kind,
tool, ok, at (watchdog.store.scan.calls_above), with the fold's own guard for PostgreSQL's late
commits (the LateWindow below the mark), so what the circuits are given is what the fold gave
them before: every tool call once, the late ones too. The circuits still count each window's
errors in the store (watchdog.daemon.stops.circuits): the calls here only say which tools to
count and feed the rate.

A cold start (a new leader, a changed reach) reads the calls of the active runs' history, as
the Scanner's cold fold did, so the rate's last minute and the circuits' first look are whole.
The steps without a cost read here go to the money's backfill by id (`unpriced_ids`), as the
fold's do: the range read is spared as before.
"""

from __future__ import annotations

import datetime as dt
from collections import Counter, deque
from collections.abc import Collection
from typing import Any, NamedTuple

from watchdog.core import lifecycle as lc
from watchdog.daemon.trust.isolation import CHUNK
from watchdog.daemon.trust.latewindow import LateWindow
from watchdog.daemon.trust.scan import MAX_PENDING_UNPRICED, RATE_WINDOW_S
from watchdog.store import scan as store
from watchdog.store.engine import Connection


class ToolCall(NamedTuple):
    """One tool call as the circuits read it (the fields of NewEvent they use)."""

    id: int
    tool: str
    ok: bool | None
    at: dt.datetime


class ToolWatch:
    """Every run's tool calls since the last tick, narrow. Not thread-safe (the tick's)."""

    def __init__(self) -> None:
        self.high_water: int | None = None
        self.window = LateWindow()
        self.recent: deque[tuple[dt.datetime, str]] = deque()  # (at, tool) of the calls read, for the rate
        # Those of `recent` per tool, kept as calls come and go: a Counter of a minute's calls
        # (60,000 at 1,000 calls/s) built every tick cost more than the rest of the watch.
        self._counts: Counter[str] = Counter()
        self._ahead: list[tuple[dt.datetime, str]] = []  # calls dated after the last `now`: counted once due
        # The steps without a cost read here, for the money to price (as Scanner.unpriced_ids: the
        # fold saw only its Reach's), until it took them.
        self.unpriced_ids: list[int] = []

    def read(self, conn: Connection, active_ids: Collection[str], *, quiet: bool = False) -> list[ToolCall]:
        """The tool calls written (or committed late) since the last read; at a cold start those of
        the active runs' history. `quiet`: no run was written since the last read (the change
        feed), so no event either: nothing is read."""
        late_ok = store.commits_late(conn)
        if self.high_water is None:
            top = store.newest_event_id(conn) or 0
            ordered = sorted(active_ids)
            rows = []
            for i in range(0, len(ordered), CHUNK):
                rows.extend(store.calls_of(conn, run_ids=ordered[i : i + CHUNK]))
            self.high_water = top
            if late_ok:
                self.window.start(conn, top, None)
            return self._took(rows)
        if quiet:
            return []
        late = self.window.late(conn, self.high_water, None) if late_ok else []
        rows = []
        for i in range(0, len(late), CHUNK):
            rows.extend(store.calls_of(conn, event_ids=late[i : i + CHUNK]))
        rows.extend(store.calls_above(conn, self.high_water))
        read = [r[0] for r in rows]
        if read:
            self.high_water = max(self.high_water, max(read))
        if late_ok:
            self.window.moved(self.high_water, read)
        return self._took(rows)

    def took_unpriced(self) -> None:
        self.unpriced_ids = []

    def _took(self, rows: list[Any]) -> list[ToolCall]:
        self.unpriced_ids.extend(r[0] for r in rows if r[1] == lc.EV_STEP and r[5] is None)
        if len(self.unpriced_ids) > MAX_PENDING_UNPRICED:  # nobody takes them (no money work)
            del self.unpriced_ids[:-MAX_PENDING_UNPRICED]
        # Only what the fold would have let through (watchdog.daemon.trust.isolation.event_defect):
        # a tool call named by a string, at a time (PostgreSQL's types guarantee both).
        calls = [ToolCall(i, tool, ok, at) for i, kind, tool, ok, at, _cost in rows
                 if kind == lc.EV_TOOL and tool.__class__ is str and isinstance(at, dt.datetime)]
        self._ahead.extend((c.at, c.tool) for c in calls)
        return calls

    def tool_rates(self, now: dt.datetime) -> Counter[str]:
        """Tool calls per tool over all runs in the last minute (Scanner.tool_rates' answer)."""
        recent, counts = self.recent, self._counts
        if self._ahead:
            due = [c for c in self._ahead if c[0] <= now]
            self._ahead = [c for c in self._ahead if c[0] > now] if len(due) < len(self._ahead) else []
            recent.extend(due)
            counts.update(tool for _at, tool in due)
        horizon = now - dt.timedelta(seconds=RATE_WINDOW_S)
        while recent and recent[0][0] < horizon:
            tool = recent.popleft()[1]
            counts[tool] -= 1
            if counts[tool] <= 0:
                del counts[tool]
        return Counter(counts)
