"""What the tick knows of active runs, from evidence it can trust: the run rows' counters, the daemon's own per-
run counters folded from the events, and what makes a row or an event unusable.

The daemon's own per-run counters, folded from the append-only events: what a run cannot reset.

A run's row is a claim its writer can rewrite (`UPDATE runs SET steps = 0, cost_eur = 0`);
its events are appended and never updated by an agent. The tick folds every new step and
tool event into a `Tally` per run, and a run is judged, and the ledger books, by the larger
of the tally and the row (`merged`): the row still counts for what the events do not show
(a child's roll-up, a record written before the daemon started for a run it never folded).

One call, one count (DESIGN.md): several witnesses (the run's own writer, source NULL; a
gateway, source "mcp" / "litellm" / "otlp") may append an event for the same call. Per
counter, count = max(the number of distinct call ids over all sources, the largest count of
any one source): never the sum. Sums (tokens, cost) follow the same rule with each call id
counted at the largest amount a witness gave it.

Rows anyone may have written by hand, as the tick judges them: one bad row or event costs
only itself. The chunked, key-by-key reads live in the store (watchdog.store.scan); what
makes a tool event unusable to the judges is decided here.

What the tick knows about active runs: counters from the run rows, and per-run
tool statistics folded incrementally from the events written since the last tick.

The caches are rebuilt from the store on a cold start (only the active runs'
events are read), so a restarted daemon knows exactly what the old one knew.
"""

from __future__ import annotations

import datetime as dt
import math
from collections import Counter, deque
from collections.abc import Collection, Container
from dataclasses import dataclass, field
from typing import Any

from watchdog.core import lifecycle as lc
from watchdog.core.policies import RunSnapshot
from watchdog.core.rowviews import RunView
from watchdog.daemon.trust.latewindow import LateWindow
from watchdog.store import scan as store
from watchdog.store.engine import Connection
from watchdog.store.scan import (CHUNK, Defect, read_isolated, EventSelection, IDENTITY as IDENTITY, LIGHT as LIGHT,
                                 MEASURES as MEASURES, L as L, OWN_BUDGETS as OWN_BUDGETS, FoldedEvent)

__all__ = ["CALLS", "COST", "ERRORS", "Evidence", "MAX_CALL_IDS", "SLOTS", "STEPS", "TOKENS", "Tally", "merged",
           "CHUNK", "Defect", "event_defect", "read_isolated", "FOLDED", "MAX_PENDING_UNPRICED", "NewEvent",
           "RATE_WINDOW_S", "RunStats", "Scanner"]


# steps, tool_calls, tool_errors, tokens, cost_eur: the tally's slots
STEPS, CALLS, ERRORS, TOKENS, COST = range(5)
SLOTS = 5
# A run's distinct call ids kept per counter: past this, the per-source counts alone decide
# (a flood of invented ids inflates only the run that wrote them, and only this far in memory).
MAX_CALL_IDS = 50_000


def _amount(v: object) -> float:
    if v is None or isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
        return 0.0
    return float(v)


@dataclass
class Tally:
    # source ("" = the run's own writer) -> [5 numbers]
    by_source: dict[str, list[float]] = field(default_factory=dict)
    # (is step, call id) -> [5 numbers], the largest per witness
    by_call: dict[tuple[bool, str], list[float]] = field(default_factory=dict)
    ids: list[float] = field(default_factory=lambda: [0, 0, 0, 0, 0.0])  # the sums over distinct call ids
    values: list[float] = field(default_factory=lambda: [0, 0, 0, 0, 0.0])  # the folded counters

    # The event's columns as stored: any value a writer put there (a bad one counts as nothing).
    def add(self, kind: str, source: object, call_id: object, ok: object, tokens_in: object, tokens_out: object,
            cost: object) -> None:
        """O(1): every number only grows, so the maxima are kept as they go."""
        own = self.by_source
        if source is None and call_id is None and (not own or (len(own) == 1 and "" in own)):
            self._own(kind == lc.EV_STEP, ok, tokens_in, tokens_out, cost)
            return
        step = kind == lc.EV_STEP
        delta = (1 if step else 0, 0 if step else 1, 1 if (not step and ok is False) else 0,
                 int(_amount(tokens_in) + _amount(tokens_out)), _amount(cost))
        src = source if isinstance(source, str) else ""
        per = self.by_source.get(src)
        if per is None:
            per = self.by_source[src] = [0, 0, 0, 0, 0.0]
        values, ids = self.values, self.ids
        for i in range(SLOTS):
            per[i] += delta[i]
            if per[i] > values[i]:
                values[i] = per[i]
        if isinstance(call_id, str) and call_id and len(self.by_call) < MAX_CALL_IDS:
            key = (step, call_id)
            cur = self.by_call.get(key)
            if cur is None:
                cur = self.by_call[key] = [0, 0, 0, 0, 0.0]
            for i in range(SLOTS):
                if delta[i] > cur[i]:
                    ids[i] += delta[i] - cur[i]
                    cur[i] = delta[i]
                    if ids[i] > values[i]:
                        values[i] = ids[i]

    def _own(self, step: bool, ok: object, tokens_in: object, tokens_out: object, cost: object) -> None:
        """The usual case, unrolled: the run's own writer alone, no call ids (its counts are the tally)."""
        per = self.by_source.get("")
        if per is None:
            per = self.by_source[""] = [0, 0, 0, 0, 0.0]
        if step:
            per[STEPS] += 1
        else:
            per[CALLS] += 1
            if ok is False:
                per[ERRORS] += 1
        if tokens_in or tokens_out:
            per[TOKENS] += int(_amount(tokens_in) + _amount(tokens_out))
        if cost:
            per[COST] += _amount(cost)
        values = self.values
        if not self.by_call:  # no witness's call ids: the writer's counts are the tally
            values[:] = per
            return
        for i in range(SLOTS):
            if per[i] > values[i]:
                values[i] = per[i]

    def add_cost(self, cost_eur: float) -> None:
        """A step the daemon priced itself (watchdog.daemon.money.moneytick): its cost counts as the writer's."""
        per = self.by_source.setdefault("", [0, 0, 0, 0, 0.0])
        per[COST] += _amount(cost_eur)
        if per[COST] > self.values[COST]:
            self.values[COST] = per[COST]


class Evidence:
    """Tallies of the active runs (rebuilt from their whole history on a cold start, like the caches)."""

    def __init__(self) -> None:
        self.tallies: dict[str, Tally] = {}

    def fold(self, run_id: str, kind: str, source: object, call_id: object, ok: object, tokens_in: object,
             tokens_out: object, cost: object) -> None:
        t = self.tallies.get(run_id)
        if t is None:
            t = self.tallies[run_id] = Tally()
        t.add(kind, source, call_id, ok, tokens_in, tokens_out, cost)

    def priced(self, run_id: str, cost_eur: float) -> None:
        t = self.tallies.get(run_id)
        if t is not None:
            t.add_cost(cost_eur)

    def keep(self, active: Container[str]) -> None:
        for rid in [r for r in self.tallies if r not in active]:
            del self.tallies[rid]

    def get(self, run_id: str) -> list[float] | None:
        t = self.tallies.get(run_id)
        return None if t is None else t.values


def merged(row_values: tuple[Any, ...], folded: list[float] | None) -> tuple[Any, ...]:
    """(steps, tool_calls, tool_errors, tokens, cost_eur): the larger of the row's and the tally's."""
    if folded is None:
        return row_values
    return tuple(f if (r is None or not isinstance(r, (int, float)) or f > r) else r
                 for r, f in zip(row_values, folded))


# -- Rows anyone may have written by hand, as the tick judges them: one bad row or event costs ---------------------

def event_defect(e: Any) -> str | None:
    """What makes a tool event unusable (None: nothing): it must name its run and tool and
    carry a timestamp the rate window can compare."""
    if not isinstance(e.run_id, str):
        return "its run_id is not text"
    if getattr(e, "kind", "tool") != "tool":  # a step (issue 20's fold): only its run and time matter
        return None if isinstance(e.at, dt.datetime) else "its timestamp `at` is missing"
    if not isinstance(e.tool, str) or not e.tool:
        return "its tool is missing (NULL or empty)"
    if not isinstance(e.at, dt.datetime):
        return "its timestamp `at` is missing"
    if e.ok not in (True, False, None, 0, 1):
        return "its `ok` is not a boolean"
    for name in ("args_hash", "error_msg"):
        if getattr(e, name) is not None and not isinstance(getattr(e, name), str):
            return f"its {name} is not text"
    if e.attempt is not None and (isinstance(e.attempt, bool) or not isinstance(e.attempt, int)):
        return "its attempt is not an integer"
    return None


# -- What the tick knows about active runs: counters from the run rows, and per-run --------------------------------

# The light row's columns, by position (the tick's modules index it with `L`).

# An event as the fold reads it (the name the tick and the circuits know it by).
NewEvent = FoldedEvent

RATE_WINDOW_S = 60.0
MAX_PENDING_UNPRICED = 100_000  # unpriced step ids kept for the money work, at most


@dataclass
class RunStats:
    signatures: Counter[tuple[str, str | None]] = field(default_factory=Counter)  # (tool, args hash)
    tools: Counter[str] = field(default_factory=Counter)
    tool_errors: Counter[str] = field(default_factory=Counter)
    last_error: dict[str, str] = field(default_factory=dict)
    recent: deque[tuple[dt.datetime, str]] = field(default_factory=deque)  # (at, tool) of tool calls, for the rate
    max_signature: int = 0  # the top signature's count, kept as calls are added (counts only grow)

    def add(self, at: dt.datetime, tool: str, args_hash: str | None, ok: bool | None, error_msg: str | None,
            retry: bool = False) -> None:
        self.tools[tool] += 1
        if not retry:  # a retry attempt repeats a call the agent asked for once: not a loop
            n = self.signatures[(tool, args_hash)] + 1
            self.signatures[(tool, args_hash)] = n
            if n > self.max_signature:
                self.max_signature = n
        if ok is False:
            self.tool_errors[tool] += 1
            # A fail-fast refusal of an open circuit is not news: keep the tool's own error.
            if error_msg and (not error_msg.startswith("ToolUnavailable") or tool not in self.last_error):
                self.last_error[tool] = error_msg
        self.recent.append((at, tool))

    def rate(self, now: dt.datetime) -> tuple[int, tuple[str, int] | None]:
        horizon = now - dt.timedelta(seconds=RATE_WINDOW_S)
        while self.recent and self.recent[0][0] < horizon:
            self.recent.popleft()
        counts = Counter(tool for at, tool in self.recent if at <= now)
        top = counts.most_common(1)
        return sum(counts.values()), (top[0] if top else None)

    def recent_upper_bound(self, horizon: dt.datetime) -> int:
        """At least rate()'s count at now = horizon + RATE_WINDOW_S (later calls count too); no Counter."""
        recent = self.recent
        while recent and recent[0][0] < horizon:
            recent.popleft()
        return len(recent)

    def top_signature(self) -> tuple[str, int] | None:
        if not self.signatures:
            return None
        (tool, _hash), count = self.signatures.most_common(1)[0]
        return tool, count

    def top_tool(self) -> tuple[str, int, int] | None:
        if not self.tools:
            return None
        tool, calls = max(self.tools.items(), key=lambda kv: (kv[1], self.tool_errors[kv[0]]))
        return tool, calls, self.tool_errors[tool]


FOLDED = store.FOLDED


class Scanner:
    """Loads active runs and folds new tool events into per-run stats."""

    def __init__(self) -> None:
        self.stats: dict[str, RunStats] = {}
        self.high_water: int | None = None  # largest event id folded in
        self.window = LateWindow()  # PostgreSQL: the ids below the mark that may still commit
        # (at, tool) over all runs: many runs hammering one tool
        self.all_recent: deque[tuple[dt.datetime, str]] = deque()
        self.defects: list[Defect] = []  # what could not be read since the tick last took them
        self._bad_runs: dict[str, str] = {}  # run id -> why its whole row did not read (read_isolated)
        self.evidence = Evidence()  # the daemon's own counters per active run (issue 20)
        self.touched: set[str] = set()  # the runs of the events the last fold read
        # The steps without a cost the folds read, and the events they could not read: what is new
        # for the backfill to price (watchdog.daemon.money.money reads exactly those). Kept until the
        # money work took them (`took_unpriced`): a tick that fails in between passes them on.
        self.unpriced_ids: list[int] = []

    def tool_rates(self, now: dt.datetime) -> Counter[str]:
        """Tool calls per tool over all runs in the last minute."""
        horizon = now - dt.timedelta(seconds=RATE_WINDOW_S)
        while self.all_recent and self.all_recent[0][0] < horizon:
            self.all_recent.popleft()
        return Counter(tool for at, tool in self.all_recent if at <= now)

    def load_active(self, conn: Connection, hosts: Collection[str] | None = None) -> list[Any]:
        """Every active run (of `hosts`, None = all), light: the LIGHT columns, then started_at
        and last_seen_at in epoch seconds."""
        return store.active_light(conn, hosts)

    def load_rows(self, conn: Connection, ids: list[str]) -> list[Any]:
        """The whole rows of the runs that need an evaluation this tick (if still active); a
        row that cannot be read (a timestamp that does not parse, labels that are not JSON)
        becomes a Defect instead."""
        return store.active_rows(conn, ids, isolated=read_isolated, defects=self.defects, suspects=self._bad_runs)

    def _events(self, conn: Connection, selection: EventSelection) -> list[NewEvent]:
        """The selected events, in id order; each one that cannot be read or used becomes a
        Defect, and its id counts as read: the high-water mark moves past it, it is never read
        again."""
        rows, unreadable = store.read_events(conn, selection, isolated=read_isolated, defects=self.defects)
        self._unreadable.extend(unreadable)
        out: list[NewEvent] = []
        for e in rows:
            why = event_defect(e)
            if why is None:
                out.append(e)
            else:
                self.defects.append(Defect(e.run_id if isinstance(e.run_id, str) else None,
                                           f"event {e.id}: {why}", e.id))
                self._unreadable.append(e.id)
        return out

    def fold(self, conn: Connection, active_ids: Collection[str], hosts: Collection[str] | None = None
             ) -> list[NewEvent]:
        """Fold the tool events written since the last tick; return them (the circuits need them too).
        With `hosts`, only the events of runs on those hosts are read (a daemon that is not the
        leader needs no other host's events). Events that cannot be used become Defects.
        `touched` is then the ids of the runs any folded event belongs to."""
        new: list[NewEvent] = []
        self._unreadable: list[int] = []
        if self.high_water is None:
            # Cold start: the full history of the active runs only, never all history.
            top = store.newest_event_id(conn)
            ordered = list(active_ids)
            for i in range(0, len(ordered), CHUNK):
                new.extend(self._events(conn, EventSelection.of_runs(ordered[i : i + CHUNK])))
            self.high_water = top or 0
            if store.commits_late(conn):  # the window below the mark, as the next folds check it
                self.window.start(conn, self.high_water, hosts)
        else:
            # Whole rows only above the high-water mark; below it, on PostgreSQL, the few that
            # committed after the fold passed their ids (watchdog.daemon.trust.latewindow). SQLite
            # commits one writer at a time, in id order: no window.
            late_ok = store.commits_late(conn)
            late = self.window.late(conn, self.high_water, hosts) if late_ok else []
            fresh: list[NewEvent] = []
            for i in range(0, len(late), CHUNK):
                fresh.extend(self._events(conn, EventSelection.by_ids(late[i : i + CHUNK])))
            fresh.extend(self._events(conn, EventSelection.folded_above(self.high_water, hosts)))
            if late:
                fresh.sort(key=lambda e: e.id)
            new.extend(fresh)
            read = [e.id for e in fresh] + self._unreadable
            if read:
                self.high_water = max(self.high_water, max(read))
            if late_ok:
                self.window.moved(self.high_water, read)
        # A set (or the ActiveSet's) is used as it is: building one of 10,000 ids each tick shows.
        active = active_ids if isinstance(active_ids, (set, frozenset)) else set(active_ids)
        self.touched = {e.run_id for e in new if e.run_id.__class__ is str}
        self.unpriced_ids.extend(e.id for e in new if e.kind == lc.EV_STEP and e.cost_eur is None)
        self.unpriced_ids.extend(self._unreadable)
        if len(self.unpriced_ids) > MAX_PENDING_UNPRICED:  # nobody takes them (a daemon without the money work)
            del self.unpriced_ids[:-MAX_PENDING_UNPRICED]
        stats = self.stats
        evidence = self.evidence
        # The all-runs tool rate is the leader's (it reads every host's events and trims the
        # window each tick); a daemon reading only its host's events keeps none of it.
        every_host = hosts is None
        if not every_host:
            self.all_recent.clear()
        tools: list[NewEvent] = []
        for e in new:
            if e.run_id in active:
                try:
                    evidence.fold(e.run_id, e.kind, e.source, e.call_id, e.ok, e.tokens_in, e.tokens_out, e.cost_eur)
                except Exception:  # noqa: BLE001 — an odd value counts nothing, never blinds the fold
                    self.defects.append(Defect(e.run_id, f"event {e.id}: it cannot be counted", e.id))
            if e.kind != lc.EV_TOOL:
                continue
            tools.append(e)
            if every_host:
                self.all_recent.append((e.at, e.tool))
            if e.run_id in active:
                st = stats.get(e.run_id)
                if st is None:  # not setdefault(id, RunStats()): that builds 3 Counters and a deque per event
                    st = stats[e.run_id] = RunStats()
                try:
                    st.add(e.at, e.tool, e.args_hash, e.ok, e.error_msg, bool(e.attempt and e.attempt > 1))
                except Exception:  # noqa: BLE001 — event_defect let through what RunStats cannot fold
                    self.defects.append(Defect(e.run_id, f"event {e.id}: it cannot be counted", e.id))
        # The runs that ended (or left this daemon) are forgotten once they are a few: a pass over
        # every run's entry each tick a run ended would make the tick O(active) again (issue 25).
        slack = len(active) // 8 + 64
        if len(stats) > len(active) + slack:
            for rid in [r for r in stats if r not in active]:
                del stats[rid]
        if len(evidence.tallies) > len(active) + slack:
            evidence.keep(active)
        return tools

    def snapshot(self, row: RunView, now: dt.datetime, started_at: dt.datetime | None = None) -> RunSnapshot:
        st = self.stats.get(row.id) or RunStats()
        calls_min, top_min = st.rate(now)
        # The larger of the row's counters and the daemon's own (watchdog.daemon.trust.scan).
        steps, calls, errors, tokens, cost = merged(
            (row.steps, row.tool_calls, row.tool_errors, (row.tokens_in or 0) + (row.tokens_out or 0), row.cost_eur),
            self.evidence.get(row.id))
        return RunSnapshot(
            id=row.id, agent=row.agent, started_at=started_at or row.started_at, last_seen_at=row.last_seen_at,
            steps=steps, tool_calls=calls, tool_errors=errors, cost_eur=cost,
            tokens=tokens, top_signature=st.top_signature(), calls_last_min=calls_min, top_tool_last_min=top_min,
        )

    def took_unpriced(self) -> None:
        """The money work read the unpriced steps the folds named (Scanner.unpriced_ids)."""
        self.unpriced_ids = []
