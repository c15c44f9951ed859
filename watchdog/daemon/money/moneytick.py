"""One tick's money work, in its enforced order: first price the steps the SDK could not, then judge.

Price the steps the SDK could not: each tick, before the runs are judged.

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

One tick's money work as a two-phase object whose order is enforced, not only documented.

    mt = money.begin(now)          # the LiveSpend the pre-filter's pass over the active runs fills
    mt.read(conn, high_water)      # inside the tick's read snapshot
    judged = mt.judge(engine, light, due)   # after it: price, every period budget, publish the spent ones
    ... mt.closing(run_id, agent) while the tick judges its runs ...
    mt.finish(engine, stopped)     # after the stops: book the ended runs, alerts, the published state

Each call checks the phase before it and raises MoneyOrderError out of order: the period
budgets are judged on one snapshot (each run counted once), the spent budgets are published
before the runs they cover are stopped, and the books are closed after the stops. A failure
inside a phase that only costs a retry (pricing, publishing, booking, alerts) is logged and
done again next tick — never at the stops' expense; a store that is down fails the tick.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Protocol

from watchdog.core import lifecycle as lc
from watchdog.core.periods import PeriodState
from watchdog.core.pricing import NO_MODEL
from watchdog.daemon.money.prices import PriceBook
from watchdog.daemon.trust.scan import Defect, read_isolated
from watchdog.daemon.trust.latewindow import ID_OVERLAP
from watchdog.daemon.trust.lightrow import LightRow, agent_of, run_id, status_of
from watchdog.store import event_rows as store
from watchdog.store.engine import Connection, Engine, store_unavailable
from watchdog.store.event_rows import MAX_PER_TICK as MAX_PER_TICK, UnpricedStep, WriteRefused
from watchdog.store.scan import commits_late, newest_event_id


_backfill_log = logging.getLogger("watchdog.prices")

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
            _backfill_log.debug("priced %d step(s) the SDK could not (%.4f EUR) in %d run(s)", rep.priced_steps, rep.cost_eur,
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


# -- One tick's money work as a two-phase object whose order is enforced, not only documented ----------------------

log = logging.getLogger("watchdog.money")


class MoneyOrderError(RuntimeError):
    """A MoneyTick phase was called out of its order (a bug in the caller, never a store state)."""


class Phase(str, Enum):
    BEGUN = "begun"  # the LiveSpend is being filled by the pre-filter
    READ = "read"  # the snapshot's side is read
    JUDGED = "judged"  # priced, judged, the spent budgets published: `closing` answers
    FINISHED = "finished"


@dataclass
class MoneyJudgement:
    """What `judge` tells the tick."""

    priced: BackfillReport  # the steps priced this tick (their deltas count on the daemon's own counters)
    periods: list[PeriodState]  # every period budget's state
    again: set[str] = field(default_factory=set)  # runs to read again and judge: repriced, or a spent budget's


class LiveSpend:
    """The active runs' live cost, summed in the tick's one pass over them (PreFilter.due): per
    agent, and per label budget for the runs whose labels are known (a run's labels never
    change, so they are read once, when it is first seen: `new`)."""

    __slots__ = ("per_agent", "labelled", "covered", "new", "light")

    def __init__(self, covered: dict[str, tuple[str, ...]] | None):
        self.per_agent: dict[str, float] = defaultdict(float)
        self.labelled: dict[str, float] = defaultdict(float)
        self.covered = covered  # run id -> the label budgets covering it; None: no [[budgets]]
        self.new: list[tuple[str, float]] = []  # (run id, live cost) of runs first seen
        self.light: Sequence[LightRow] = []  # the tick's light rows (for forgetting the runs that ended)


class Books(Protocol):
    """What a MoneyTick drives: watchdog.daemon.money.money.Money, which makes it (`Money.begin`). A
    protocol, so that this module sits below money.py and never imports it (no import cycle)."""

    backfill: Backfill
    closed: dict[str, PeriodState]

    def live_spend(self) -> LiveSpend: ...

    def read(self, conn: Connection, now: dt.datetime, high_water: int | None = None, *,
             quiet: bool = False, none_ended: bool = False, unpriced: Sequence[int] | None = None,
             ranged: bool = False, new: Sequence[tuple[str, float]] = ()) -> None: ...

    def learn_labels(self, conn: Connection, spend: LiveSpend) -> None: ...

    def price(self, engine: Engine, now: dt.datetime) -> BackfillReport: ...

    def judge(self, spend: LiveSpend, now: dt.datetime) -> list[PeriodState]: ...

    def publish_closed(self, engine: Engine, now: dt.datetime) -> bool: ...

    def closing(self, run_id: str, agent: str) -> PeriodState | None: ...

    def book(self, engine: Engine, now: dt.datetime) -> int: ...

    def after(self, engine: Engine, now: dt.datetime, stopped: dict[str, list[str]] | None = None) -> None: ...


class MoneyTick:
    """One tick of Money (watchdog.daemon.money.money): made by `Money.begin`, used once."""

    def __init__(self, money: Books, now: dt.datetime):
        self.money = money
        self.now = now
        self.phase = Phase.BEGUN
        self.spend: LiveSpend = money.live_spend()  # filled by PreFilter.due

    def _step(self, expected: Phase, to: Phase | None = None) -> None:
        if self.phase is not expected:
            raise MoneyOrderError(f"money phase {self.phase.value!r}: expected {expected.value!r}")
        if to is not None:
            self.phase = to

    def read(self, conn: Connection, high_water: int | None, *, quiet: bool = False,
             none_ended: bool = False, unpriced: Sequence[int] | None = None, ranged: bool = False) -> list[Defect]:
        """In the tick's read snapshot, after the pre-filter summed the live spend: the unpriced
        steps, the ledger's spend, the labels of runs first seen. Returns the steps that could
        not be read (reported with the tick's other defects). `quiet`, `none_ended`, `unpriced`,
        `ranged`: see Money.read."""
        self._step(Phase.BEGUN, Phase.READ)
        m = self.money
        m.read(conn, self.now, high_water, quiet=quiet, none_ended=none_ended, unpriced=unpriced, ranged=ranged,
               new=self.spend.new)
        defects, m.backfill.defects = list(m.backfill.defects), []
        m.learn_labels(conn, self.spend)
        return defects

    def judge(self, engine: Engine, light: Sequence[LightRow], due: Sequence[str]) -> MoneyJudgement:
        """After the snapshot: price what the SDK could not, judge every period budget, publish
        the spent ones (before the tick stops the runs they cover: see Money.publish_closed)."""
        self._step(Phase.READ, Phase.JUDGED)
        m = self.money
        try:
            priced = m.price(engine, self.now)
        except Exception as exc:  # noqa: BLE001 — pricing is retried next tick; never at the stops' expense
            if store_unavailable(exc):
                raise
            log.exception("pricing the unpriced steps failed; retried next tick")
            priced = BackfillReport()
        periods = m.judge(self.spend, self.now)
        again = {r.run_id for r, _cost in priced.deltas if r.status in lc.ACTIVE_STATUSES}
        if m.closed:  # the running runs a spent period budget covers are due too
            again.update(self._covered_running(light, due))
        _retried_next_tick(lambda: m.publish_closed(engine, self.now), "publishing the spent budgets")
        return MoneyJudgement(priced, periods, again)

    def closing(self, run_id: str, agent: str) -> PeriodState | None:
        """The spent period budget covering this run, or None (while the tick judges its runs)."""
        self._step(Phase.JUDGED)
        return self.money.closing(run_id, agent)

    def finish(self, engine: Engine, stopped: Mapping[str, list[str]]) -> int:
        """After the stops: book the ended runs, then the alerts and the published state.
        `stopped`: scope key -> the runs this tick stopped for that scope's budget. Returns
        the runs booked."""
        self._step(Phase.JUDGED, Phase.FINISHED)
        m, booked = self.money, 0

        def book() -> None:
            nonlocal booked
            booked = m.book(engine, self.now)

        _retried_next_tick(book, "booking ended runs")
        _retried_next_tick(lambda: m.after(engine, self.now, dict(stopped)),
                           "period budgets / drift / unpriced alerts")
        return booked

    def _covered_running(self, light: Sequence[LightRow], due: Sequence[str]) -> list[str]:
        """The running runs not already due that a spent period budget covers (only while one is
        spent: every active run, by name through the light row's getters)."""
        seen = set(due)
        closing = self.money.closing
        return [rid for r in light if status_of(r) == lc.RUNNING and (rid := run_id(r)) not in seen
                and closing(rid, agent_of(r)) is not None]


def _retried_next_tick(fn: Callable[[], object], what: str) -> None:
    try:
        fn()
    except Exception as exc:  # noqa: BLE001 — retried next tick; never at the expense of the stops
        if store_unavailable(exc):
            raise
        log.exception("%s failed; retried next tick", what)
