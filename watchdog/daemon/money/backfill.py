"""Price the steps the SDK could not: each tick, before the runs are judged.

A step the SDK could not price (its model is in no published price) is written with
`cost_eur` NULL and its tokens added to `runs.cost_unpriced_tokens`. Here the daemon
prices it with its PriceBook (overrides, then genai-prices at the step's date),
sets the event's cost with a compare-and-set (NULL → cost: two daemons price it once)
and moves the cost onto the run, so `max_cost` and the period budgets see it in the
same tick. What no table prices stays NULL and is reported (once per model and day).

Cost per tick: one query on the tick's own read snapshot, over the events written since
the last tick (plus PostgreSQL's late-commit overlap, as the scanner reads them); a cold
start also reads the unpriced steps of the runs not booked yet. A write only when a step
was priced. Never a scan of history.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field

from watchdog.core.pricing import NO_MODEL
from watchdog.daemon.money.prices import PriceBook
from watchdog.daemon.trust.isolation import Defect, read_isolated
from watchdog.daemon.trust.latewindow import ID_OVERLAP
from watchdog.store import event_rows as store
from watchdog.store.event_rows import MAX_PER_TICK as MAX_PER_TICK, UnpricedStep, WriteRefused
from watchdog.store.engine import Connection, Engine
from watchdog.store.scan import commits_late, newest_event_id

log = logging.getLogger("watchdog.prices")

CHUNK = 500
TOP_EVERY = 10


@dataclass
class Unpriced:
    """A model no table prices, as seen this tick: who uses it and how many tokens."""

    agents: set[str] = field(default_factory=set)
    tokens: int = 0
    steps: int = 0


@dataclass
class BackfillReport:
    priced_steps: int = 0
    cost_eur: float = 0.0
    runs: set[str] = field(default_factory=set)  # runs whose cost changed
    # (the found row of the run, cost added): for this tick's sums
    deltas: list[tuple[UnpricedStep, float]] = field(default_factory=list)
    learned: list[str] = field(default_factory=list)  # models newly in the published price table
    unpriced: dict[str, Unpriced] = field(default_factory=dict)  # model -> Unpriced (first seen this tick)


def _unpriced_steps(conn: Connection, defects: list[Defect], suspects: dict[int, str], *,
                    run_ids: Sequence[str] | None = None, above: int | None = None,
                    event_ids: Sequence[int] | None = None) -> list[UnpricedStep]:
    return store.unpriced_steps(conn, run_ids=run_ids, above=above, event_ids=event_ids, isolated=read_isolated,
                                defects=defects, suspects=suspects)


class Backfill:
    def __init__(self, book: PriceBook) -> None:
        self.book = book
        self.low: int | None = None  # the next tick reads the unpriced steps above this event id
        self._seen: set[int] = set()  # unpriced events already reported (within the overlap)
        self._reads = 0
        self.backlog = False  # the last read stopped at MAX_PER_TICK: more wait above it
        self.defects: list[Defect] = []  # steps that could not be read (the tick reports them: quarantine.py)
        self._bad: dict[int, str] = {}  # their ids, read alone while they stay bad (scan.read_isolated)

    def read(self, conn: Connection, high_water: int | None = None) -> list[UnpricedStep]:
        """The unpriced steps written since the last read, on the tick's own read snapshot (no
        transaction of its own). `high_water`: the largest event id the tick saw (the scanner's):
        the next read starts ID_OVERLAP below it; the true top is asked every TOP_EVERY reads, so
        the range stays bounded when no tool event moves the scanner's mark."""
        self._reads += 1
        if self.low is None or high_water is None or self._reads % TOP_EVERY == 0:
            top = newest_event_id(conn) or 0
        else:
            top = high_water
        if self.low is None:
            # Cold start: the unpriced steps of every run not booked yet (active ones and
            # those that ended unbooked), found through the runs' own counter.
            ids = store.unbooked_unpriced_runs(conn)
            rows: dict[int, UnpricedStep] = {}
            for i in range(0, len(ids), CHUNK):
                for r in _unpriced_steps(conn, self.defects, self._bad, run_ids=ids[i : i + CHUNK]):
                    rows[r.id] = r
            for r in _unpriced_steps(conn, self.defects, self._bad, above=max(0, top - ID_OVERLAP)):
                rows[r.id] = r  # rows written by plain SQL that did not count their tokens
            found = sorted(rows.values(), key=lambda r: r.id)
        else:
            found = _unpriced_steps(conn, self.defects, self._bad, above=self.low)
        self.backlog = len(found) >= MAX_PER_TICK
        if self.backlog:
            self.low = found[-1].id  # a backlog: go on from there next tick
        else:
            # Re-read ID_OVERLAP ids below the top: a PostgreSQL commit can land below it late.
            # SQLite commits in id order: nothing lands below it (the window cost a range read).
            overlap = ID_OVERLAP if commits_late(conn) else 0
            self.low = max(self.low or 0, top - overlap, 0)
        return found

    def skip(self, conn: Connection, high_water: int | None) -> None:
        """In place of `read`, when the tick's fold named the steps written since the last read
        that lack a cost (Scanner.unpriced_ids: read with `steps`): the range moves on as `read`
        would move it."""
        if self.low is None or high_water is None or self.backlog:
            return  # a cold start, or a backlog: the next read goes on from where it is
        overlap = ID_OVERLAP if commits_late(conn) else 0
        self.low = max(self.low, high_water - overlap, 0)

    def steps(self, conn: Connection, event_ids: Sequence[int], found: list[UnpricedStep]) -> list[UnpricedStep]:
        """`found` and the unpriced steps among `event_ids` (those the fold saw without a cost, and
        those the last tick failed to price), in id order."""
        rows = {r.id: r for r in found}
        ordered = sorted({i for i in event_ids if i not in rows})
        for i in range(0, len(ordered), CHUNK):
            for r in _unpriced_steps(conn, self.defects, self._bad, event_ids=ordered[i : i + CHUNK]):
                rows[r.id] = r
        return sorted(rows.values(), key=lambda r: r.id)

    def apply(self, engine: Engine, found: list[UnpricedStep], now: dt.datetime) -> BackfillReport:
        """Price the steps `read` found; write what was priced (its own short transaction)."""
        rep = BackfillReport()
        low = self.low or 0  # set by read(), which comes first
        self._seen = {i for i in self._seen if i > low}
        if not found:
            return rep
        priced: list[tuple[UnpricedStep, float]] = []
        for r in found:
            model = r.model or NO_MODEL
            cost = self.book.cost_eur(r.model, r.at, r.tokens_in or 0, r.tokens_out or 0, r.cached_tokens_in or 0,
                                      r.reasoning_tokens or 0)
            if cost is None:
                if r.id not in self._seen:
                    self._seen.add(r.id)
                    u = rep.unpriced.setdefault(model, Unpriced())
                    u.agents.add(r.agent)
                    u.tokens += (r.tokens_in or 0) + (r.tokens_out or 0)
                    u.steps += 1
                continue
            priced.append((r, cost))
            if r.model is not None and self.book.learn(r.model, now):  # (priced: it has a model)
                rep.learned.append(r.model)
        if priced:
            self._write(engine, priced, rep)
        return rep

    def _write(self, engine: Engine, priced: list[tuple[UnpricedStep, float]], rep: BackfillReport) -> None:
        by_run: dict[str, list[tuple[UnpricedStep, float]]] = defaultdict(list)
        for r, cost in priced:
            by_run[r.run_id].append((r, cost))
        cost_of: dict[str, float] = {}  # run id -> the cost priced now
        with engine.begin() as conn:
            for rid in sorted(by_run):
                # A run row its writer holds locked is passed over, never waited on: its steps
                # stay unpriced (priced a later tick), and its steps and its cost move together.
                if store.hold_run_row(conn, rid):
                    self._price_run(conn, rid, by_run[rid], rep, cost_of)
        rep.runs.update(cost_of)
        if rep.priced_steps:
            log.debug("priced %d step(s) the SDK could not (%.4f EUR) in %d run(s)", rep.priced_steps, rep.cost_eur,
                      len(cost_of))

    def _price_run(self, conn: Connection, rid: str, steps: list[tuple[UnpricedStep, float]], rep: BackfillReport,
                   cost_of: dict[str, float]) -> None:
        """One run's priced steps, then its cost. Each step and the run in a SAVEPOINT of its own: a
        row written by hand that the store's checks refuse to update costs only itself (it stays
        unpriced, reported)."""
        cost_run, tokens_run, any_priced = 0.0, 0, False
        for r, cost in steps:
            try:
                priced_now = store.price_step(conn, r.id, cost)
            except WriteRefused:
                self.defects.append(Defect(r.run_id, f"event {r.id}: its price cannot be written", r.id))
                continue
            if not priced_now:
                continue  # another daemon priced it first
            cost_run += cost
            tokens_run += (r.tokens_in or 0) + (r.tokens_out or 0)
            any_priced = True
            rep.deltas.append((r, cost))
            rep.priced_steps += 1
            rep.cost_eur += cost
        if not any_priced:
            return
        cost_of[rid] = cost_run
        try:
            store.add_run_cost(conn, rid, cost_run, tokens_run)
        except WriteRefused:
            self.defects.append(Defect(rid, "its cost cannot be written (a counter the checks refuse)"))
