"""What the tick knows about active runs: counters from the run rows, and per-run
tool statistics folded incrementally from the events written since the last tick.

The caches are rebuilt from the store on a cold start (only the active runs'
events are read), so a restarted daemon knows exactly what the old one knew.
"""

from __future__ import annotations

import datetime as dt
from collections import Counter, deque
from dataclasses import dataclass, field

from sqlalchemy import and_, case, func, select

from watchdog.core import lifecycle as lc
from watchdog.core.budgets import RUN_BUDGET_KEYS
from watchdog.core.policies import RunSnapshot
from watchdog.daemon.evidence import Evidence, merged
from watchdog.daemon.isolation import CHUNK, Defect, event_defect, read_isolated
from watchdog.store import dialects
from watchdog.store.engine import store_unavailable
from watchdog.store.schema import events, runs

RATE_WINDOW_S = 60.0
# PostgreSQL assigns ids at insert but commits in any order: re-read this many ids
# below the high-water mark so a late commit is never missed (dedupe by id).
ID_OVERLAP = 2000

# What the tick reads of EVERY active run, each tick: enough to tell whether the run needs
# a full evaluation. The two timestamps come back as epoch seconds computed by the
# database, so no datetime (and no row of 31 columns) is built for a healthy run.
# Columns are read by position (a Row's attribute access costs at 10,000 runs): `L` names them.
IDENTITY = ("id", "agent", "status", "host", "pid", "pid_create_time", "resumes")
# The counters the registry's budgets measure, as the run row holds them ("tokens" is in + out).
MEASURES = ("steps", "tool_calls", "cost_eur", "tokens")
# parent_id last: the daemon records the parent a run names when it first sees it (issue 20).
LIGHT = (*IDENTITY, *RUN_BUDGET_KEYS, *MEASURES, "started_s", "seen_s", "parent_id")
L = {name: i for i, name in enumerate(LIGHT)}
OWN_BUDGETS = slice(L[RUN_BUDGET_KEYS[0]], L[RUN_BUDGET_KEYS[-1]] + 1)


def epoch_s(col, dialect_name: str):
    """A UTCDateTime column as float seconds since the epoch, computed by the database."""
    return dialects.for_name(dialect_name).epoch_s(col)


@dataclass
class RunStats:
    signatures: Counter = field(default_factory=Counter)
    tools: Counter = field(default_factory=Counter)
    tool_errors: Counter = field(default_factory=Counter)
    last_error: dict = field(default_factory=dict)
    recent: deque = field(default_factory=deque)  # (at, tool) of tool calls, for the rate
    max_signature: int = 0  # the top signature's count, kept as calls are added (counts only grow)

    def add(self, at: dt.datetime, tool: str, args_hash: str | None, ok: bool | None, error_msg: str | None,
            retry: bool = False):
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


def _on_hosts(q, hosts):
    """Only the events of runs on `hosts` (None: every host's): a join on the run's primary key,
    cheap for the few events above the high-water mark."""
    if hosts is None:
        return q
    return q.join_from(events, runs, runs.c.id == events.c.run_id).where(runs.c.host.in_(sorted(hosts)))


@dataclass(slots=True)
class NewEvent:
    id: int
    run_id: str
    at: dt.datetime
    tool: str
    args_hash: str | None
    ok: bool | None
    error_msg: str | None
    attempt: int | None = None
    # issue 20: what the evidence fold counts (watchdog.daemon.evidence)
    kind: str = lc.EV_TOOL
    tokens_in: int | None = None
    tokens_out: int | None = None
    cost_eur: float | None = None
    source: str | None = None
    call_id: str | None = None


EVENT_COLS = (events.c.id, events.c.run_id, events.c.at, events.c.tool, events.c.args_hash, events.c.ok,
              events.c.error_msg, events.c.attempt, events.c.kind, events.c.tokens_in, events.c.tokens_out,
              events.c.cost_eur, events.c.source, events.c.call_id)
# The events the fold reads: tool calls (stats, circuits) and steps (the evidence counters).
FOLDED = (lc.EV_TOOL, lc.EV_STEP)


class Scanner:
    """Loads active runs and folds new tool events into per-run stats."""

    def __init__(self):
        self.stats: dict[str, RunStats] = {}
        self.high_water: int | None = None  # largest event id folded in
        self._seen: set[int] = set()
        self.all_recent: deque = deque()  # (at, tool) over all runs: many runs hammering one tool
        self.defects: list[Defect] = []  # what could not be read since the tick last took them
        self._bad_runs: dict[str, str] = {}  # run id -> why its whole row did not read (read_isolated)
        self.evidence = Evidence()  # the daemon's own counters per active run (issue 20)

    def tool_rates(self, now: dt.datetime) -> Counter:
        """Tool calls per tool over all runs in the last minute."""
        horizon = now - dt.timedelta(seconds=RATE_WINDOW_S)
        while self.all_recent and self.all_recent[0][0] < horizon:
            self.all_recent.popleft()
        return Counter(tool for at, tool in self.all_recent if at <= now)

    def load_active(self, conn, hosts=None) -> list:
        """Every active run (of `hosts`, None = all), light: the LIGHT columns, then started_at
        and last_seen_at in epoch seconds."""
        name = conn.dialect.name
        tokens = runs.c.tokens_in + runs.c.tokens_out
        if name == "sqlite":  # SQLite adds text as 0: a text counter would read as "few tokens"
            tokens = case((and_(func.typeof(runs.c.tokens_in) == "integer",
                                func.typeof(runs.c.tokens_out) == "integer"), tokens))
        measures = {"tokens": tokens}
        q = select(*(runs.c[c] for c in (*IDENTITY, *RUN_BUDGET_KEYS)),
                   *(measures.get(m, runs.c[m] if m in runs.c else None) for m in MEASURES),
                   epoch_s(runs.c.started_at, name), epoch_s(runs.c.last_seen_at, name), runs.c.parent_id
                   ).where(runs.c.status.in_(lc.ACTIVE_STATUSES))
        if hosts is not None:
            q = q.where(runs.c.host.in_(sorted(hosts)))
        return conn.execute(q).all()

    def load_rows(self, conn, ids: list[str]) -> list:
        """The whole rows of the runs that need an evaluation this tick (if still active); a
        row that cannot be read (a timestamp that does not parse, labels that are not JSON)
        becomes a Defect instead."""
        return read_isolated(conn, lambda part: select(runs).where(and_(
            runs.c.id.in_(part), runs.c.status.in_(lc.ACTIVE_STATUSES))), ids,
            table=runs, key_col=runs.c.id, defects=self.defects, suspects=self._bad_runs)

    def _events(self, conn, q_for) -> list["NewEvent"]:
        """The events of `q_for(columns)`, in id order. The usual case is one query; if it fails
        (one event whose timestamp does not parse), the ids alone are read (integers always
        read) and the rows by id, each bad event becoming a Defect: the high-water mark moves
        past it, it is never read again."""
        try:
            with conn.begin_nested():
                rows = conn.execute(q_for(EVENT_COLS).order_by(events.c.id)).all()
        except Exception as exc:  # noqa: BLE001
            if store_unavailable(exc):
                raise
            ids = conn.execute(q_for((events.c.id,)).order_by(events.c.id)).scalars().all()
            rows = read_isolated(conn, lambda part: select(*EVENT_COLS).where(events.c.id.in_(part)), list(ids),
                                 table=events, key_col=events.c.id, defects=self.defects, suspects={}, event=True)
            rows.sort(key=lambda r: r[0])
            # The ids of the bad ones count as read: the high-water mark must pass them.
            self._unreadable.extend(sorted(set(ids) - {r[0] for r in rows}))
        out = []
        for r in rows:
            e = NewEvent(*r)
            why = event_defect(e)
            if why is None:
                out.append(e)
            else:
                self.defects.append(Defect(e.run_id if isinstance(e.run_id, str) else None,
                                           f"event {e.id}: {why}", e.id))
                self._unreadable.append(e.id)
        return out

    def fold(self, conn, active_ids: list[str], hosts=None) -> list[NewEvent]:
        """Fold the tool events written since the last tick; return them (the circuits need them too).
        With `hosts`, only the events of runs on those hosts are read (a daemon that is not the
        leader needs no other host's events). Events that cannot be used become Defects."""
        new: list[NewEvent] = []
        self._unreadable: list[int] = []
        if self.high_water is None:
            # Cold start: the full history of the active runs only, never all history.
            top = conn.execute(select(func.max(events.c.id))).scalar()
            for i in range(0, len(active_ids), CHUNK):
                part = active_ids[i : i + CHUNK]
                new.extend(self._events(conn, lambda cols, part=part: select(*cols).where(and_(
                    events.c.run_id.in_(part), events.c.kind.in_(FOLDED)))))
            self.high_water = top or 0
            overlap = select(events.c.id).where(events.c.id > self.high_water - ID_OVERLAP)
            self._seen = {r[0] for r in conn.execute(overlap)}
        else:
            # Whole rows only above the high-water mark; in the overlap below it, ids first and
            # whole rows only for the ids never seen (a late PostgreSQL commit: rare).
            low = max(0, self.high_water - ID_OVERLAP)
            seen = self._seen
            ids = conn.execute(_on_hosts(select(events.c.id).where(and_(
                events.c.id > low, events.c.id <= self.high_water, events.c.kind.in_(FOLDED))), hosts)
            ).scalars().all()
            late = [i for i in ids if i not in seen]
            fresh = []
            for i in range(0, len(late), CHUNK):
                part = late[i : i + CHUNK]
                fresh.extend(self._events(conn, lambda cols, part=part: select(*cols).where(events.c.id.in_(part))))
            high = self.high_water
            fresh.extend(self._events(conn, lambda cols: _on_hosts(select(*cols).where(and_(
                events.c.id > high, events.c.kind.in_(FOLDED))), hosts)))
            if late:
                fresh.sort(key=lambda e: e.id)
            new.extend(fresh)
            read = [e.id for e in fresh] + self._unreadable
            if read:
                self.high_water = max(self.high_water, max(read))
            self._seen = {i for i in self._seen if i > self.high_water - ID_OVERLAP}
            self._seen.update(read)
        active = set(active_ids)
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
        for rid in list(self.stats):
            if rid not in active:
                del self.stats[rid]
        if len(evidence.tallies) > len(active):
            evidence.keep(active)
        return tools

    def snapshot(self, row, now: dt.datetime, started_at: dt.datetime | None = None) -> RunSnapshot:
        st = self.stats.get(row.id) or RunStats()
        calls_min, top_min = st.rate(now)
        # The larger of the row's counters and the daemon's own (watchdog.daemon.evidence).
        steps, calls, errors, tokens, cost = merged(
            (row.steps, row.tool_calls, row.tool_errors, (row.tokens_in or 0) + (row.tokens_out or 0), row.cost_eur),
            self.evidence.get(row.id))
        return RunSnapshot(
            id=row.id, agent=row.agent, started_at=started_at or row.started_at, last_seen_at=row.last_seen_at,
            steps=steps, tool_calls=calls, tool_errors=errors, cost_eur=cost,
            tokens=tokens, top_signature=st.top_signature(), calls_last_min=calls_min, top_tool_last_min=top_min,
        )
