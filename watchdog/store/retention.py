"""What the leader does to ended runs: seals their top tool once, then prunes them when they are old.

Retention: ended runs older than `[store] keep_days` go, with their events,
interventions and (delivered) alerts; so do old run-less interventions and
delivered alerts (circuit changes, all-runs alarms) and the lease rows of hosts
gone for as long. On PostgreSQL the expired days of events are dropped whole
(watchdog.store.partitions) before any row is deleted.

In small batches, each its own short transaction, with a pause after each: a
prune never holds a lock long enough to stall the agents' writes (on SQLite a
write transaction blocks every other writer, so the pause is as long as the
batch was: agents get the lock at least half the time). A run with an alert
still waiting for delivery is kept until the alert is delivered.

Sealing ended runs: their top tool is written on the run row once, so listing
ended runs (`runs --all`) reads rows from an index and never aggregates events.

Whoever ended the run (the SDK, the daemon's ladder, another language's plain
SQL), the leader seals it a tick later: one place covers every writer. Until
then `views.list_runs` computes the top tool from the events, as before.
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import ColumnElement, Executable, and_, delete, exists, func, or_, select, bindparam, update
from sqlalchemy.engine import Engine

from watchdog.core import lifecycle as lc
from watchdog.store import dialects, partitions
from watchdog.store.engine import bound_lock_waits, read_connection
from watchdog.store.schema import alerts, daemons, events, interventions, runs
from watchdog.store.views import tool_stats


RUNS_PER_BATCH = 200
# Rows per delete, and the sleep after each batch as a share of its duration: per backend
# (watchdog.store.dialects: on SQLite every writer waits while a batch runs).
MIN_PAUSE_S = 0.002


@dataclass
class PruneReport:
    cutoff: dt.datetime
    runs: int = 0
    events: int = 0
    interventions: int = 0
    alerts: int = 0
    hosts: int = 0
    partitions: int = 0  # whole day partitions of events dropped (PostgreSQL, revision 0015)
    partition_drop_s: float = 0.0  # the longest of their transactions
    partition_lock_s: float = 0.0  # the longest the writers waited for one (watchdog.store.partitions.Dropped)
    partitions_busy: str | None = None  # a day left whole for later: events stayed locked (Dropped.busy)
    complete: bool = True  # False when the time budget ran out first (the rest goes next time)
    batches: int = 0
    seconds: float = 0.0
    dry_run: bool = False
    longest_batch_s: float = 0.0
    by_table: dict[str, int] = field(default_factory=dict)

    def summary(self) -> str:
        verb = "would prune" if self.dry_run else "pruned"
        text = (f"{verb} {self.runs} ended runs with {self.events} events, {self.interventions} interventions "
                f"and {self.alerts} delivered alerts ended before {self.cutoff:%Y-%m-%d %H:%M:%S} UTC")
        if self.hosts:
            text += f", and {self.hosts} hosts' old lease rows"
        if self.partitions:
            text += f" ({self.partitions} day partitions of events dropped whole)"
        if self.partitions_busy:
            text += f" ({self.partitions_busy} left whole: events was locked by an open transaction)"
        if not self.dry_run:
            text += f" in {self.seconds:.1f} s ({self.batches} batches, longest {self.longest_batch_s * 1000:.0f} ms)"
        if not self.complete:
            text += "; more left for the next round"
        return text


def _prunable(cutoff: dt.datetime) -> ColumnElement[bool]:
    """Ended before the cutoff, and no alert of theirs still waiting for delivery (a dead
    letter waits for nothing: it goes with its run, as a delivered alert does)."""
    waiting = exists(select(alerts.c.id).where(and_(alerts.c.run_id == runs.c.id, alerts.c.delivered_at.is_(None),
                                                    alerts.c.dead_at.is_(None))))
    # NOT IN the active statuses rather than IN the ended ones: the planner then walks the
    # ended_at index (no scan of every ended run's status), and a status added later is covered.
    return and_(runs.c.ended_at < cutoff, runs.c.status.not_in(lc.ACTIVE_STATUSES), ~waiting)


def _loose_interventions(cutoff: dt.datetime) -> ColumnElement[bool]:
    return and_(interventions.c.run_id.is_(None), interventions.c.at < cutoff)


def _loose_alerts(cutoff: dt.datetime) -> ColumnElement[bool]:
    return and_(alerts.c.run_id.is_(None), or_(alerts.c.delivered_at < cutoff, alerts.c.dead_at < cutoff))


def count(engine: Engine, cutoff: dt.datetime) -> PruneReport:
    """What a prune at `cutoff` would delete (`db prune --dry-run`)."""
    rep = PruneReport(cutoff=cutoff, dry_run=True)
    with read_connection(engine) as conn:
        ids = select(runs.c.id).where(_prunable(cutoff))
        rep.runs = conn.execute(select(func.count()).select_from(ids.subquery())).scalar_one()
        rep.events = conn.execute(select(func.count()).where(events.c.run_id.in_(ids))).scalar_one()
        rep.interventions = conn.execute(select(func.count()).where(
            (interventions.c.run_id.in_(ids)) | _loose_interventions(cutoff))).scalar_one()
        rep.alerts = conn.execute(select(func.count()).where(
            (alerts.c.run_id.in_(ids)) | _loose_alerts(cutoff))).scalar_one()
        rep.hosts = conn.execute(select(func.count()).where(daemons.c.expires_at < cutoff)).scalar_one()
    return rep


class _Batches:
    """Runs each delete in its own transaction, then pauses; stops at the time budget."""

    def __init__(self, engine: Engine, rep: PruneReport, budget_s: float | None,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.engine = engine
        self.rep = rep
        self.deadline = None if budget_s is None else time.monotonic() + budget_s
        self.ratio = dialects.of(engine).prune_pause_ratio
        self.sleep = sleep

    def out_of_time(self) -> bool:
        if self.deadline is not None and time.monotonic() >= self.deadline:
            self.rep.complete = False
            return True
        return False

    def run(self, *statements: Executable) -> list[int]:
        t0 = time.perf_counter()
        with self.engine.begin() as conn:
            counts = [conn.execute(s).rowcount for s in statements]
        took = time.perf_counter() - t0
        self.rep.batches += 1
        self.rep.longest_batch_s = max(self.rep.longest_batch_s, took)
        self.sleep(max(MIN_PAUSE_S, took * self.ratio))
        return counts


def prune(engine: Engine, cutoff: dt.datetime, *, budget_s: float | None = None, runs_per_batch: int = RUNS_PER_BATCH,
          rows_per_batch: int | None = None, drop_partitions: bool = True) -> PruneReport:
    """Delete what `count` counts, batch by batch; with `budget_s`, stop after about that long.
    `drop_partitions=False` deletes expired days' events row by row too (benchmarks/bench_scale.py
    measures the one against the other)."""
    rows_per_batch = rows_per_batch or dialects.of(engine).prune_rows_per_batch
    rep = PruneReport(cutoff=cutoff)
    t0 = time.perf_counter()
    b = _Batches(engine, rep, budget_s)
    try:
        # PostgreSQL: the expired days go whole first (what a run retention keeps had in them
        # is kept); the batches below then delete only what the dropped days did not hold.
        if drop_partitions:
            dropped = partitions.drop_expired(engine, cutoff, _prunable(cutoff), b.out_of_time)
            rep.partitions, rep.events = dropped.partitions, dropped.events
            rep.partition_drop_s, rep.partition_lock_s = dropped.longest_s, dropped.locked_s
            rep.partitions_busy = dropped.busy
        while not b.out_of_time():
            with read_connection(engine) as conn:
                ids = conn.execute(select(runs.c.id).where(_prunable(cutoff)).order_by(runs.c.ended_at)
                                   .limit(runs_per_batch)).scalars().all()
            if not ids:
                break
            while not b.out_of_time():
                some = select(events.c.id).where(events.c.run_id.in_(ids)).limit(rows_per_batch)
                (n,) = b.run(delete(events).where(events.c.id.in_(some)))
                rep.events += n
                if n < rows_per_batch:
                    break
            if not rep.complete:
                break
            # The runs last: their alerts, interventions and any event written meanwhile go with them.
            n_alerts, n_iv, n_runs = b.run(
                delete(alerts).where(alerts.c.run_id.in_(ids)),
                delete(interventions).where(interventions.c.run_id.in_(ids)),
                delete(runs).where(and_(runs.c.id.in_(ids), _prunable(cutoff))))
            rep.alerts += n_alerts
            rep.interventions += n_iv
            rep.runs += n_runs
        for table, cond, attr in ((alerts, _loose_alerts(cutoff), "alerts"),
                                  (interventions, _loose_interventions(cutoff), "interventions")):
            while not b.out_of_time():
                some = select(table.c.id).where(cond).limit(rows_per_batch)
                (n,) = b.run(delete(table).where(table.c.id.in_(some)))
                setattr(rep, attr, getattr(rep, attr) + n)
                if n < rows_per_batch:
                    break
        if rep.complete and not b.out_of_time():
            (rep.hosts,) = b.run(delete(daemons).where(daemons.c.expires_at < cutoff))
    finally:
        rep.seconds = time.perf_counter() - t0
    return rep


def cutoff_for(now: dt.datetime, keep_days: float) -> dt.datetime:
    return now - dt.timedelta(days=keep_days)


# -- Sealing ended runs: their top tool is written on the run row once, so listing -----------------------

SEAL_BATCH = 500


def unsealed() -> ColumnElement[bool]:
    # Spelled as the partial index ix_runs_unsealed's predicate, so both databases use it.
    return and_(runs.c.ended_at.is_not(None), runs.c.top_tool_calls.is_(None))


def seal_ended(engine: Engine, limit: int = SEAL_BATCH) -> int:
    """Seal up to `limit` ended runs (the oldest first); returns how many."""
    with read_connection(engine) as conn:
        ids = conn.execute(select(runs.c.id).where(unsealed()).order_by(runs.c.ended_at).limit(limit)).scalars().all()
        if not ids:
            return 0
        stats = tool_stats(conn, ids)
    params: list[dict[str, Any]] = []
    for rid in ids:
        top = stats[rid][0] if stats[rid] else None
        params.append({"rid": rid, "b_tool": top.name if top else None, "b_calls": top.calls if top else 0,
                       "b_errors": top.errors if top else 0})
    with engine.begin() as conn:
        bound_lock_waits(conn)
        # What is written here is read back from the events whenever it is missing (the partial
        # index finds the run unsealed again): a commit that a database crash loses costs a re-seal,
        # so it does not wait for the log flush (an fsync each tick that runs ended).
        dialects.of(conn).commit_without_flush(conn)
        # A row its writer holds locked (PostgreSQL: a login may lock its own runs, ended ones too)
        # is skipped, not waited for: sealed at a later pass, never holding up the others.
        free = set(conn.execute(select(runs.c.id).where(runs.c.id.in_(ids)).with_for_update(skip_locked=True))
                   .scalars())
        params = [p for p in params if p["rid"] in free]
        if not params:
            return len(ids)
        conn.execute(update(runs).where(and_(runs.c.id == bindparam("rid"), runs.c.top_tool_calls.is_(None)))
                     .values(top_tool=bindparam("b_tool"), top_tool_calls=bindparam("b_calls"),
                             top_tool_errors=bindparam("b_errors")), params)
    return len(ids)
