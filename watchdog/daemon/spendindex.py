"""Each active run's live cost, summed by agent and by label budget, between full ticks (issue 25).

The period budgets count every active run's live cost, but an incremental tick looks only at
the runs that changed: SpendIndex keeps each run's cost as the pre-filter last counted it, and
a running total per agent and per label budget, moved by the difference when a run's cost
moves. A tick's sums then cost what changed, not a pass over every run's cost.

A running total drifts from the exact sum by a rounding error per update: every key is summed
again from its runs every RESUM_EVERY fills (and at once when a total stops being finite: a
cost of infinity that came and went leaves NaN), so the drift stays at the last digits.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from watchdog.daemon.money import LiveSpend

RESUM_EVERY = 64  # fills between two exact sums of every key


class _Sums:
    """Costs per key (an agent, or a label budget's scope), each with its running total."""

    def __init__(self) -> None:
        self.costs: dict[str, dict[str, float]] = defaultdict(dict)  # key -> run id -> cost
        self.total: dict[str, float] = {}
        self.dirty: set[str] = set()  # keys whose total is summed again at the next fill

    def set(self, key: str, rid: str, cost: float) -> None:
        runs = self.costs[key]
        old = runs.get(rid, 0.0)
        runs[rid] = cost
        t = self.total[key] = self.total.get(key, 0.0) + (cost - old)
        if not math.isfinite(t):
            self.dirty.add(key)

    def pop(self, key: str, rid: str) -> None:
        runs = self.costs.get(key)
        if runs is None or rid not in runs:
            return
        old = runs.pop(rid)
        if not runs:  # the key's last run: nothing left to count (nor to drift)
            del self.costs[key]
            self.total.pop(key, None)
            self.dirty.discard(key)
            return
        t = self.total[key] = self.total[key] - old
        if not math.isfinite(t):
            self.dirty.add(key)

    def settled(self, every: bool) -> dict[str, float]:
        """The totals, the dirty ones (or, with `every`, all) summed again from their runs."""
        for key in (list(self.costs) if every else self.dirty):
            runs = self.costs.get(key)
            if runs:
                self.total[key] = sum(runs.values())
        self.dirty.clear()
        return self.total


class SpendIndex:
    """Each active run's live cost (as PreFilter.due counts it), by agent and by label budget."""

    def __init__(self) -> None:
        self._agent_of: dict[str, str] = {}
        self._scopes_of: dict[str, tuple[str, ...]] = {}
        self._by_agent = _Sums()
        self._by_scope = _Sums()
        self._unscoped: dict[str, float] = {}  # run id -> cost, its label budgets not known yet
        self._fills = 0

    def __len__(self) -> int:
        return len(self._agent_of)

    def put(self, rid: str, agent: str, cost: float, covered: Mapping[str, tuple[str, ...]] | None) -> None:
        scopes = () if covered is None else covered.get(rid)
        if (scopes is not None and self._agent_of.get(rid) == agent and rid not in self._unscoped
                and self._scopes_of.get(rid, ()) == scopes):  # the usual case: only its cost moved
            self._by_agent.set(agent, rid, cost)
            for scope in scopes:
                self._by_scope.set(scope, rid, cost)
            return
        self.drop(rid)
        self._agent_of[rid] = agent
        self._by_agent.set(agent, rid, cost)
        if scopes is None:
            self._unscoped[rid] = cost  # its labels are read this tick (LiveSpend.new): counted from the next
            return
        self._scope(rid, scopes, cost)

    def drop(self, rid: str) -> None:
        agent = self._agent_of.pop(rid, None)
        if agent is None:
            return
        self._by_agent.pop(agent, rid)
        self._unscoped.pop(rid, None)
        for scope in self._scopes_of.pop(rid, ()):
            self._by_scope.pop(scope, rid)

    def learn(self, covered: Mapping[str, tuple[str, ...]] | None) -> None:
        """The runs whose label budgets the money work learned since they were put."""
        for rid in [r for r in self._unscoped if covered is None or r in covered]:
            self._scope(rid, () if covered is None else covered[rid], self._unscoped.pop(rid))

    def fill(self, spend: LiveSpend) -> None:
        """The sums over every run, in place of the pre-filter's over the few it looked at."""
        self._fills += 1
        every = self._fills % RESUM_EVERY == 0
        spend.per_agent.clear()
        spend.labelled.clear()
        spend.per_agent.update(self._by_agent.settled(every))
        spend.labelled.update(self._by_scope.settled(every))

    def _scope(self, rid: str, scopes: tuple[str, ...], cost: float) -> None:
        if scopes:
            self._scopes_of[rid] = scopes
            for scope in scopes:
                self._by_scope.set(scope, rid, cost)
