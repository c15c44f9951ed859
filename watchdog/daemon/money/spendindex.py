"""Each active run's live cost, summed by agent and by label budget, between full ticks (issue 25).

The period budgets count every active run's live cost, but an incremental tick looks only at
the runs that changed: SpendIndex keeps each run's cost as the pre-filter last counted it, and
a running total per agent and per label budget, moved by the difference when a run's cost
moves. A tick's sums then cost what changed, not a pass over every run's cost.

A running total drifts from the exact sum by a rounding error per update: every key is summed
again from its runs every RESUM_EVERY fills, so the drift stays at the last digits. A cost at or
above EXACT_ABOVE_EUR makes its keys summed again at once, whenever it joins, moves or leaves: a
total that held a huge cost loses the small ones beside it (45 + 1.2e18 - 1.2e18 == 0: a writer
appends steps whose costs, each within the store's checks, sum to that much, and its run's end
would hide every other run's spend of its agent until the next full tick); so does a total that
stops being finite (a cost of infinity that came and went leaves NaN).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from watchdog.daemon.money.moneytick import LiveSpend

RESUM_EVERY = 64  # fills between two exact sums of every key
# A live cost this large (no run spends a million euros) is summed exactly with its neighbours,
# never by difference: a running total loses ~1e-16 of its largest term per update.
EXACT_ABOVE_EUR = 1e6
# run id -> the label budgets covering it; None: its labels not read yet (LiveSpend.covered.get)
Scopes = Callable[[str], "tuple[str, ...] | None"]
_INF = math.inf


class _Entry:
    """One run as the index counts it: its agent, its label budgets (None: not known yet), its cost."""

    __slots__ = ("agent", "scopes", "cost")

    def __init__(self, agent: str, scopes: tuple[str, ...] | None, cost: float) -> None:
        self.agent, self.scopes, self.cost = agent, scopes, cost


class _Totals:
    """The runs of each key (an agent, or a label budget's scope) and their running total."""

    def __init__(self) -> None:
        self.members: dict[str, set[str]] = {}
        self.total: dict[str, float] = {}
        self.dirty: set[str] = set()  # keys summed again at the next fill

    def join(self, key: str, rid: str, cost: float) -> None:
        members = self.members.get(key)
        if members is None:
            members = self.members[key] = set()
        members.add(rid)
        self.move(key, cost, cost)

    def leave(self, key: str, rid: str, cost: float) -> None:
        members = self.members.get(key)
        if members is None or rid not in members:
            return
        members.discard(rid)
        if not members:  # the key's last run: nothing left to count (nor to drift)
            del self.members[key]
            self.total.pop(key, None)
            self.dirty.discard(key)
            return
        self.move(key, -cost, cost)

    def move(self, key: str, delta: float, largest: float) -> None:
        """Add `delta` to the key's total; `largest`: the larger of the old and the new cost."""
        t = self.total[key] = self.total.get(key, 0.0) + delta
        if not (-_INF < t < _INF and largest < EXACT_ABOVE_EUR):  # (NaN fails both: summed again)
            self.dirty.add(key)

    def settled(self, runs: Mapping[str, _Entry], every: bool) -> dict[str, float]:
        """The totals, the dirty ones (or, with `every`, all) summed again from their runs."""
        for key in (list(self.members) if every else self.dirty):
            members = self.members.get(key)
            if members:
                self.total[key] = sum(runs[rid].cost for rid in members)
        self.dirty.clear()
        return self.total


class SpendIndex:
    """Each active run's live cost (as PreFilter.due counts it), by agent and by label budget."""

    def __init__(self) -> None:
        self._runs: dict[str, _Entry] = {}
        self._by_agent = _Totals()
        self._by_scope = _Totals()
        self._unscoped: set[str] = set()  # runs whose label budgets are not known yet
        self._fills = 0
        # issue 32 (None: no profile names `owners`): the name a run's spend counts under
        # (watchdog.daemon.trust.trust.Trust.spend_as); another than its agent's: no label budget.
        self.spend_as: Callable[[str, str], str | None] | None = None

    def __len__(self) -> int:
        return len(self._runs)

    def put(self, rid: str, agent: str, cost: float, covered: Mapping[str, tuple[str, ...]] | None) -> bool:
        """One run's live cost; True when its label budgets are not known yet (see put_many)."""
        return bool(self.put_many(((rid, agent, cost),), covered))

    def put_many(self, items: Iterable[tuple[str, str, float]], covered: Mapping[str, tuple[str, ...]] | None
                 ) -> list[tuple[str, float]]:
        """Each (run id, agent, live cost); returns (run id, cost) of those whose label budgets are
        not known yet (`covered` does not name them: their labels are read this tick, LiveSpend.new,
        and they count for their label budgets from the next). One loop, its lookups bound once:
        an incremental tick puts every run it looked at."""
        unknown: list[tuple[str, float]] = []
        runs_get = self._runs.get
        covered_get: Scopes | None = covered.get if covered is not None else None
        if self.spend_as is not None:  # (rare: a profile names its owners)
            items, covered_get = self._whose(items, covered_get)
        agent_total, agent_dirty = self._by_agent.total, self._by_agent.dirty
        scope_move = self._by_scope.move
        for rid, agent, cost in items:
            scopes = () if covered_get is None else covered_get(rid)
            e = runs_get(rid)
            if e is not None and scopes is not None and e.agent == agent and e.scopes == scopes:
                # The usual case: its cost moved, or not at all (a tool call costs nothing).
                if cost != e.cost:
                    old, delta = e.cost, cost - e.cost
                    largest = cost if cost > old else old
                    e.cost = cost
                    t = agent_total[agent] = agent_total[agent] + delta
                    if not (-_INF < t < _INF and largest < EXACT_ABOVE_EUR):  # (as _Totals.move)
                        agent_dirty.add(agent)
                    for scope in scopes:
                        scope_move(scope, delta, largest)
                continue
            self.drop(rid)
            self._runs[rid] = _Entry(agent, scopes, cost)
            self._by_agent.join(agent, rid, cost)
            if scopes is None:
                self._unscoped.add(rid)
                unknown.append((rid, cost))
            else:
                for scope in scopes:
                    self._by_scope.join(scope, rid, cost)
        return unknown

    def _whose(self, items: Iterable[tuple[str, str, float]], covered_get: Scopes | None
               ) -> tuple[list[tuple[str, str, float]], Scopes | None]:
        """The items under the name each run's spend counts (a run whose owner is not checked
        yet: left out), and the label-budget lookup that answers none for those booked elsewhere."""
        spend_as = self.spend_as
        assert spend_as is not None
        out: list[tuple[str, str, float]] = []
        elsewhere: set[str] = set()
        for rid, agent, cost in items:
            key = spend_as(rid, agent)
            if key is None:
                self.drop(rid)
                continue
            if key != agent:
                elsewhere.add(rid)
            out.append((rid, key, cost))
        if not elsewhere:
            return out, covered_get
        inner = covered_get

        def lookup(rid: str) -> tuple[str, ...] | None:
            return () if rid in elsewhere else (() if inner is None else inner(rid))

        return out, lookup

    def drop(self, rid: str) -> None:
        e = self._runs.pop(rid, None)
        if e is None:
            return
        self._by_agent.leave(e.agent, rid, e.cost)
        self._unscoped.discard(rid)
        for scope in e.scopes or ():
            self._by_scope.leave(scope, rid, e.cost)

    def learn(self, covered: Mapping[str, tuple[str, ...]] | None) -> None:
        """The runs whose label budgets the money work learned since they were put."""
        for rid in [r for r in self._unscoped if covered is None or r in covered]:
            self._unscoped.discard(rid)
            e = self._runs[rid]
            e.scopes = () if covered is None else covered[rid]
            for scope in e.scopes:
                self._by_scope.join(scope, rid, e.cost)

    def fill(self, spend: LiveSpend) -> None:
        """The sums over every run, in place of the pre-filter's over the few it looked at."""
        self._fills += 1
        every = self._fills % RESUM_EVERY == 0
        spend.per_agent.clear()
        spend.labelled.clear()
        spend.per_agent.update(self._by_agent.settled(self._runs, every))
        spend.labelled.update(self._by_scope.settled(self._runs, every))
