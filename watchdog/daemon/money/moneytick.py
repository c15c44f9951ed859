"""One tick's money work as a two-phase object whose order is enforced, not only documented.

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
from watchdog.daemon.money.backfill import Backfill, BackfillReport
from watchdog.daemon.trust.isolation import Defect
from watchdog.daemon.trust.lightrow import LightRow, agent_of, run_id, status_of
from watchdog.store.engine import Connection, Engine, store_unavailable

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

    __slots__ = ("per_agent", "labelled", "covered", "new", "light", "i_id")

    def __init__(self, covered: dict[str, tuple[str, ...]] | None):
        self.per_agent: dict[str, float] = defaultdict(float)
        self.labelled: dict[str, float] = defaultdict(float)
        self.covered = covered  # run id -> the label budgets covering it; None: no [[budgets]]
        self.new: list[tuple[str, float]] = []  # (run id, live cost) of runs first seen
        self.light: Sequence[LightRow] = []  # the tick's light rows (for forgetting the runs that ended)
        self.i_id = 0  # the id's position in `light` (the pre-filter's positional pass; others read by name)


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
