"""The daemon's own per-run counters, folded from the append-only events: what a run cannot reset.

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
"""

from __future__ import annotations

import math
from collections.abc import Container
from typing import Any
from dataclasses import dataclass, field

from watchdog.core import lifecycle as lc

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
        """A step the daemon priced itself (watchdog.daemon.money.backfill): its cost counts as the writer's."""
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
