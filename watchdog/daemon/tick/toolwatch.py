"""The leader's store-wide tool calls when judges are sharded (issue 35).

The circuits (errors per tool across runs) and the all-runs tool rate are the leader's duties
and need every run's tool calls. Before sharding the leader folded every event for them (the
Scanner's whole rows, its tallies and evidence); a sharded leader folds only its Reach's, like
any judge, and reads here what those two duties use of every folded event, grouped by tool in
the database (watchdog.store.toolcounts: per tool its calls' ids and times, whether one failed,
the steps without a cost; O(tools) rows, not a row per event), with the fold's own guard for
PostgreSQL's late commits (the LateWindow below the mark), so what the circuits are given is
what the fold gave them before: every tool that failed, every tool call counted once, the late
ones too. The circuits still count each window's errors in the store
(watchdog.daemon.stops.circuits): the calls here only say which tools to count and feed the rate.

A cold start (a new leader, a changed reach) reads the calls of the active runs' history (by
row, once: watchdog.store.scan.calls_of), as the Scanner's cold fold did, so the rate's last
minute and the circuits' first look are whole.
The steps without a cost read here go to the money's backfill by id (`unpriced_ids`), as the
fold's do: the range read is spared as before.
"""

from __future__ import annotations

import datetime as dt
from collections import Counter, deque
from collections.abc import Collection
from typing import Any, NamedTuple

from watchdog.core import lifecycle as lc
from watchdog.daemon.trust.scan import CHUNK, MAX_PENDING_UNPRICED, RATE_WINDOW_S
from watchdog.daemon.trust.latewindow import LateWindow
from watchdog.store import scan as store, toolcounts
from watchdog.store.engine import Connection


_NONE_ABOVE = (1 << 63) - 1  # grouped_calls' bound above which no id is: the late ids only


class ToolCall(NamedTuple):
    """A tool's new calls as the circuits read them (the fields of NewEvent they use): `ok` False
    when one of them failed."""

    id: int  # the newest of them
    tool: str
    ok: bool | None


class ToolWatch:
    """Every run's tool calls since the last tick, grouped by tool. Not thread-safe (the tick's)."""

    def __init__(self) -> None:
        self.high_water: int | None = None
        self.window = LateWindow()
        # Per tool, the times (epoch s) of the calls counted in the rate, oldest first (as read):
        # its count is the deque's length, no Counter of a minute's calls built every tick.
        self.recent: dict[str, deque[float]] = {}
        self._ahead: list[tuple[float, str]] = []  # calls dated after the last `now`: counted once due
        # The steps without a cost read here, for the money to price (as Scanner.unpriced_ids: the
        # fold saw only its Reach's), until it took them.
        self.unpriced_ids: list[int] = []

    def read(self, conn: Connection, active_ids: Collection[str], *, quiet: bool = False) -> list[ToolCall]:
        """The tools called (or committed late) since the last read, one ToolCall each; at a cold
        start those of the active runs' history. `quiet`: no run was written since the last read
        (the change feed), so no event either: nothing is read."""
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
            return self._took(_grouped(rows))
        if quiet:
            return []
        if late_ok:  # the window's check and the read above the mark in one round trip
            groups, check = toolcounts.grouped_calls_and_window(conn, self.high_water,
                                                                self.window.bottom(self.high_water))
            late = self.window.late(conn, self.high_water, None, check=check)
            if late:  # (rare: a commit below the mark since the last read)
                groups += toolcounts.grouped_calls(conn, _NONE_ABOVE, late)
        else:
            groups = toolcounts.grouped_calls(conn, self.high_water)
        read = [i for g in groups for i in g.ids]
        if read:
            self.high_water = max(self.high_water, max(read))
        if late_ok:
            self.window.moved(self.high_water, read)
        return self._took(groups)

    def took_unpriced(self) -> None:
        self.unpriced_ids = []

    def _took(self, groups: list[toolcounts.CallGroup]) -> list[ToolCall]:
        calls: list[ToolCall] = []
        for g in groups:
            self.unpriced_ids.extend(g.unpriced)
            # Only what the fold would have let through (watchdog.daemon.trust.scan.event_defect):
            # a tool call named by a string (PostgreSQL's types guarantee its time).
            if g.kind != lc.EV_TOOL or g.tool.__class__ is not str or not g.at_s:
                continue
            assert g.tool is not None
            calls.append(ToolCall(max(g.ids), g.tool, False if g.failed else True))
            self._ahead.extend((at, g.tool) for at in g.at_s)
        if len(self.unpriced_ids) > MAX_PENDING_UNPRICED:  # nobody takes them (no money work)
            del self.unpriced_ids[:-MAX_PENDING_UNPRICED]
        return calls

    def tool_rates(self, now: dt.datetime) -> Counter[str]:
        """Tool calls per tool over all runs in the last minute (Scanner.tool_rates' answer)."""
        now_s = now.timestamp()
        recent = self.recent
        if self._ahead:
            ahead, self._ahead = self._ahead, []
            for at, tool in ahead:
                if at <= now_s:
                    q = recent.get(tool)
                    if q is None:
                        q = recent[tool] = deque()
                    q.append(at)
                else:
                    self._ahead.append((at, tool))
        horizon = now_s - RATE_WINDOW_S
        out: Counter[str] = Counter()
        for tool in list(recent):
            q = recent[tool]
            while q and q[0] < horizon:
                q.popleft()
            if q:
                out[tool] = len(q)
            else:
                del recent[tool]
        return out


def _grouped(rows: list[Any]) -> list[toolcounts.CallGroup]:
    """calls_of's rows (id, kind, tool, ok, at, cost_eur) as grouped_calls' answer (a cold start)."""
    by: dict[tuple[str, Any], toolcounts.CallGroup] = {}
    for i, kind, tool, ok, at, cost in rows:
        g = by.get((kind, tool))
        if g is None:
            g = by[(kind, tool)] = toolcounts.CallGroup(str(kind), tool if tool.__class__ is str else None,
                                                         [], [], False, [])
        g.ids.append(i)
        if kind == lc.EV_TOOL and isinstance(at, dt.datetime):
            g.at_s.append(at.timestamp())
        if ok is False and not g.failed:
            by[(kind, tool)] = g = g._replace(failed=True)
        if kind == lc.EV_STEP and cost is None:
            g.unpriced.append(i)
    return list(by.values())
