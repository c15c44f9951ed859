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
from dataclasses import dataclass, field

from sqlalchemy import and_, case, func, select, update

from watchdog.core import lifecycle as lc
from watchdog.core.pricing import NO_MODEL
from watchdog.daemon.prices import PriceBook
from watchdog.daemon.isolation import Defect, read_isolated
from watchdog.daemon.scan import ID_OVERLAP
from watchdog.store.engine import store_unavailable
from watchdog.store.schema import events, runs

log = logging.getLogger("watchdog.prices")

CHUNK = 500
TOP_EVERY = 10
MAX_PER_TICK = 20_000  # unpriced steps examined per tick at most (a backlog drains over ticks)


@dataclass
class Unpriced:
    """A model no table prices, as seen this tick: who uses it and how many tokens."""

    agents: set = field(default_factory=set)
    tokens: int = 0
    steps: int = 0


@dataclass
class BackfillReport:
    priced_steps: int = 0
    cost_eur: float = 0.0
    runs: set = field(default_factory=set)  # runs whose cost changed
    deltas: list = field(default_factory=list)  # (the found row of the run, cost added): for this tick's sums
    learned: list = field(default_factory=list)  # models newly in the published price table
    unpriced: dict = field(default_factory=dict)  # model -> Unpriced (first seen this tick)


_COLS = (events.c.id, events.c.run_id, events.c.at, events.c.model, events.c.tokens_in, events.c.tokens_out,
         events.c.cached_tokens_in, events.c.reasoning_tokens, runs.c.agent, runs.c.status, runs.c.labels,
         runs.c.ended_at, runs.c.last_seen_at)


def _unpriced_steps(conn, *conds, defects: list | None = None, suspects: dict | None = None):
    """The unpriced steps matching `conds`, in id order. One step that cannot be read (a timestamp
    that does not parse, of a step or of its run) costs only itself: it becomes a Defect."""
    def q_for(cols):
        return (select(*cols).select_from(events.join(runs, runs.c.id == events.c.run_id))
                .where(and_(events.c.kind == lc.EV_STEP, events.c.cost_eur.is_(None), runs.c.booked_at.is_(None),
                            *conds)).order_by(events.c.id).limit(MAX_PER_TICK))
    try:
        with conn.begin_nested():
            return conn.execute(q_for(_COLS)).all()
    except Exception as exc:  # noqa: BLE001
        if store_unavailable(exc):
            raise
    ids = conn.execute(q_for((events.c.id,))).scalars().all()
    rows = read_isolated(conn, lambda part: select(*_COLS).select_from(events.join(runs, runs.c.id == events.c.run_id))
                         .where(events.c.id.in_(part)), list(ids), table=events, key_col=events.c.id,
                         defects=defects if defects is not None else [], suspects=suspects if suspects is not None else {},
                         event=True)
    return sorted(rows, key=lambda r: r.id)


class Backfill:
    def __init__(self, book: PriceBook):
        self.book = book
        self.low: int | None = None  # the next tick reads the unpriced steps above this event id
        self._seen: set[int] = set()  # unpriced events already reported (within the overlap)
        self._reads = 0
        self.defects: list = []  # steps that could not be read (the tick reports them: quarantine.py)
        self._bad: dict[int, str] = {}  # their ids, read alone while they stay bad (scan.read_isolated)

    def read(self, conn, high_water: int | None = None) -> list:
        """The unpriced steps written since the last read, on the tick's own read snapshot (no
        transaction of its own). `high_water`: the largest event id the tick saw (the scanner's):
        the next read starts ID_OVERLAP below it; the true top is asked every TOP_EVERY reads, so
        the range stays bounded when no tool event moves the scanner's mark."""
        self._reads += 1
        if self.low is None or high_water is None or self._reads % TOP_EVERY == 0:
            top = conn.execute(select(func.max(events.c.id))).scalar() or 0
        else:
            top = high_water
        if self.low is None:
            # Cold start: the unpriced steps of every run not booked yet (active ones and
            # those that ended unbooked), found through the runs' own counter.
            ids = conn.execute(select(runs.c.id).where(and_(
                runs.c.status.in_(lc.STATUSES), runs.c.booked_at.is_(None),
                runs.c.cost_unpriced_tokens > 0))).scalars().all()
            rows = {}
            for i in range(0, len(ids), CHUNK):
                for r in _unpriced_steps(conn, events.c.run_id.in_(ids[i : i + CHUNK]), defects=self.defects,
                                         suspects=self._bad):
                    rows[r.id] = r
            for r in _unpriced_steps(conn, events.c.id > max(0, top - ID_OVERLAP), defects=self.defects,
                                         suspects=self._bad):
                rows[r.id] = r  # rows written by plain SQL that did not count their tokens
            found = sorted(rows.values(), key=lambda r: r.id)
        else:
            found = _unpriced_steps(conn, events.c.id > self.low, defects=self.defects, suspects=self._bad)
        if len(found) >= MAX_PER_TICK:
            self.low = found[-1].id  # a backlog: go on from there next tick
        else:
            # Re-read ID_OVERLAP ids below the top: a PostgreSQL commit can land below it late.
            self.low = max(self.low or 0, top - ID_OVERLAP, 0)
        return found

    def apply(self, engine, found: list, now: dt.datetime) -> BackfillReport:
        """Price the steps `read` found; write what was priced (its own short transaction)."""
        rep = BackfillReport()
        low = self.low
        self._seen = {i for i in self._seen if i > low}
        if not found:
            return rep
        priced = []
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
            if self.book.learn(r.model, now):
                rep.learned.append(r.model)
        if priced:
            self._write(engine, priced, rep)
        return rep

    def _write(self, engine, priced, rep: BackfillReport) -> None:
        per_run: dict[str, list] = defaultdict(lambda: [0.0, 0])
        with engine.begin() as conn:
            for r, cost in priced:
                # Each step and each run in a SAVEPOINT of its own: a row written by hand that the
                # store's checks refuse to update costs only itself (it stays unpriced, reported).
                try:
                    with conn.begin_nested():
                        res = conn.execute(update(events).where(and_(events.c.id == r.id,
                                                                     events.c.cost_eur.is_(None)))
                                           .values(cost_eur=cost))
                except Exception as exc:  # noqa: BLE001
                    if store_unavailable(exc):
                        raise
                    self.defects.append(Defect(r.run_id, f"event {r.id}: its price cannot be written", r.id))
                    continue
                if res.rowcount != 1:
                    continue  # another daemon priced it first
                acc = per_run[r.run_id]
                acc[0] += cost
                acc[1] += (r.tokens_in or 0) + (r.tokens_out or 0)
                rep.deltas.append((r, cost))
                rep.priced_steps += 1
                rep.cost_eur += cost
            for rid, (cost, tokens) in sorted(per_run.items()):
                left = runs.c.cost_unpriced_tokens
                try:
                    with conn.begin_nested():
                        conn.execute(update(runs).where(runs.c.id == rid).values(
                            cost_eur=runs.c.cost_eur + cost,
                            cost_unpriced_tokens=case((left > tokens, left - tokens), else_=0)))
                except Exception as exc:  # noqa: BLE001
                    if store_unavailable(exc):
                        raise
                    self.defects.append(Defect(rid, "its cost cannot be written (a counter the checks refuse)"))
        rep.runs.update(per_run)
        if rep.priced_steps:
            log.info("priced %d step(s) the SDK could not (%.4f EUR) in %d run(s)", rep.priced_steps, rep.cost_eur,
                     len(per_run))
