"""Several daemons on one store: whose runs each one judges, and the cluster's duties (the day partitions of
`events` among them).

The leader's duty of making the next day partitions of `events` (PostgreSQL, revision 0015).

Every PARTITIONS_EVERY_S of the store's time, and at the first tick this daemon leads: cheap
(one catalogue read when the partitions are there), idempotent, and DAYS_AHEAD days ahead, so
a leader that is down for a day still finds today's partition made. Rows for a day nobody made
land in the default partition and move into the day's partition when it is made.

Several daemons on one store: whose runs each one judges, and the cluster duties.

Per-run policies are per host: each daemon judges the active runs of its own
host (only it may signal them). The leader (`watchdog.daemon.leases.lease`) also judges
the runs of every host that has active runs but no live daemon (no lease row,
an expired lease, or on PostgreSQL a host lock no session holds): it *adopts*
them, requests cooperative stops for those over budget, and alerts once per
host and lost daemon "host h2 has no live daemon: its runs cannot be signalled".
The killer still never signals a process of another host.

The cluster duties run on the leader only, each failing alone: the list in
`ClusterDuties.jobs` is the one place to add one (period budgets, drift...).
Without a lease (a Ticker driven by tests or `run --once` on a fresh store),
the daemon is its store's sole daemon: leader, judging its host and adopting
the hosts without a daemon.
"""

from __future__ import annotations

import datetime as dt
import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Mapping, Protocol

from watchdog.core.outcomes import AlertKind, Outcome, Say
from watchdog.core.config import Config
from watchdog.core.interventions import Action
from watchdog.core.seal import Sealer
from watchdog.core.text import one_line
from watchdog.store import leases, retention, partitions
from watchdog.store.alerts import queued, Audit, announce
from watchdog.store.engine import Engine, read_connection
from watchdog.store.leases import Holder

if TYPE_CHECKING:
    from watchdog.daemon.leases.lease import Lease


_partition_duty_log = logging.getLogger("watchdog.daemon")

PARTITIONS_EVERY_S = 600.0
# After `events` stayed locked (an open transaction): the next attempt, which queues every writer
# for up to partitions.LOCK_TIMEOUT_MS while it waits, this much later.
PARTITIONS_BUSY_RETRY_S = 120.0


class Clocked(Protocol):
    """What the duty reads of the leader's tick (cluster.DutyTick): only its store time; a
    protocol here, so that this module does not import cluster, which imports it."""

    now: dt.datetime


class PartitionDuty:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._next_at: dt.datetime | None = None
        self._busy = False  # the last attempt found events locked (logged once)

    def __call__(self, t: Clocked) -> None:
        if self._next_at is not None and t.now < self._next_at:
            return
        try:
            made = partitions.ensure_ahead(self.engine)
        except partitions.Busy as busy:
            made = busy.made
            if not self._busy:
                _partition_duty_log.warning("events: the next day partitions wait: events is locked by an open transaction "
                            "(idle in transaction?); tried again in %.0f s (rows land in %s meanwhile)",
                            PARTITIONS_BUSY_RETRY_S, partitions.DEFAULT)
            self._busy = True
            self._next_at = t.now + dt.timedelta(seconds=PARTITIONS_BUSY_RETRY_S)
        else:
            self._busy = False
            self._next_at = t.now + dt.timedelta(seconds=PARTITIONS_EVERY_S)
        if made:
            _partition_duty_log.info("events: made day partitions %s", ", ".join(made))


# -- Several daemons on one store: whose runs each one judges, and the cluster duties ------------------------------

log = logging.getLogger("watchdog.cluster")

PRUNE_EVERY_S = 300.0  # after a prune that finished; one that ran out of time goes on next tick
# After a day partition was left because events stayed locked (an open transaction): the next
# prunes delete rows only, and the DETACH, which queues every writer while it waits, is tried again this much later.
PARTITION_DROP_RETRY_S = 600.0
PRUNE_BUDGET_MAX_S = 2.0
PRUNE_BUDGET_SHARE = 0.2  # of tick_s: the prune never makes a tick late
# Ended runs are sealed in batches at most this often (a backlog goes on every tick): until then
# a listing reads their top tool from their events, so only the tick's cost changes (issue 25:
# several round trips on every tick where a run ended, for what no stop depends on).
SEAL_EVERY_S = 30.0


@dataclass(frozen=True)
class Role:
    """This daemon's part in the store for one tick."""

    leader: bool
    hosts: frozenset[str]  # whose active runs it judges: its own, and (leader) the adopted ones
    adopted: Mapping[str, Holder | None] = field(default_factory=dict)  # host -> its last daemon (None: never had one)
    active: Mapping[str, int] = field(default_factory=dict)  # active runs per adopted host
    grew: bool = False  # hosts were added since the last tick: their runs' history is not folded yet


class Membership:
    """Leadership and the judged hosts, refreshed at the start of each tick."""

    def __init__(self, engine: Engine, host: str, lease: Lease | None = None) -> None:
        self.engine = engine
        self.host = host
        self.lease = lease
        self._hosts: frozenset[str] | None = None

    def refresh(self, known: Mapping[str, int] | None = None) -> Role:
        """`known`: the active runs per host as the tick's ActiveSet counted them at its last read
        (watchdog.daemon.tick.activeset), which spares a count over every active run; None: count them."""
        others = None if known is None else {h: n for h, n in known.items() if n > 0 and h != self.host}
        # A leader with other hosts to check reads them on its lease's session at once: that read
        # proves the session (and so its locks) alive, as the ping would.
        leader = self.lease.refresh(ping=not others) if self.lease is not None else True
        adopted: dict[str, Holder | None] = {}
        active: dict[str, int] = others or {}
        if leader:
            if known is None:
                with read_connection(self.engine) as conn:
                    active = leases.active_hosts(conn, exclude=self.host)
            if active:
                # On the lease's own session where it has one (PostgreSQL): one round trip.
                adopted = (self.lease.read(lambda conn: leases.orphans(conn, active)) if self.lease is not None
                           else _orphans(self.engine, active))
        hosts = frozenset({self.host, *adopted})
        before = self._hosts
        grew = before is not None and not hosts <= before
        if before is not None and grew:
            log.warning("adopting the runs of %s (no live daemon there)", ", ".join(sorted(hosts - before)))
        self._hosts = hosts
        return Role(leader=leader, hosts=hosts, adopted=adopted, active={h: active[h] for h in adopted}, grew=grew)

    def touch(self, now: dt.datetime, last_event_id: int | None) -> None:
        """After a tick: extend the lease (it expires LEASE_TICKS ticks after the last good one)."""
        if self.lease is not None:
            self.lease.touch(now, last_event_id)
            return
        # No lease (tests, --once): keep the row's bookkeeping if any.
        leases.note_tick(self.engine, self.host, now=now, last_event_id=last_event_id)


def _orphans(engine: Engine, active: Mapping[str, int]) -> dict[str, Holder | None]:
    with read_connection(engine) as conn:
        return leases.orphans(conn, active)


@dataclass
class DutyTick:
    now: dt.datetime
    role: Role
    new_events: list[Any]  # the tool events this tick folded (all hosts' on the leader)
    scanner: Any  # the ticker's Scanner (the all-runs tool rate)
    none_ended: bool = False  # no run ended since the last tick (the change feed, issue 25)


class ClusterDuties:
    """What exactly one daemon of the store does each tick: the leader."""

    def __init__(self, engine: Engine, config: Config, *, circuits: Any = None, by: str,
                 sealer: Sealer | None = None) -> None:
        self.engine = engine
        self.config = config
        self.circuits = circuits
        self.by = by
        self.sealer = sealer  # the daemon's key: its alerts are sealed (no key: none is queued)
        self._alerted: set[str] = set()
        self._next_prune_at: dt.datetime | None = None
        self._next_drop_at: dt.datetime | None = None  # partitions left busy: not before then
        self._sealed_all = False  # the last seal left no ended run unsealed
        self._last_seal_at: dt.datetime | None = None
        self._ended_since_seal = False  # a run ended after the last seal: due at the next batch
        self.last_prune: retention.PruneReport | None = None
        self.jobs: list[tuple[str, Callable[[DutyTick], None]]] = [
            ("adopted hosts", self.alert_adopted),
            ("tool circuits", self.update_circuits),
            ("sealing ended runs", self.seal),
            ("retention", self.prune),
            ("event partitions", PartitionDuty(engine)),
        ]

    def run(self, t: DutyTick) -> None:
        from watchdog.store.engine import store_unavailable

        for name, job in self.jobs:
            try:
                job(t)
            except Exception as exc:
                if store_unavailable(exc):
                    raise  # the store is down: the whole tick is retried
                log.exception("cluster duty %s failed; retried next tick", name)

    # -- the jobs -------------------------------------------------------------------------

    def alert_adopted(self, t: DutyTick) -> None:
        for host, last in sorted(t.role.adopted.items()):
            key = (AlertKind.NO_DAEMON.key(host, last.pid, f"{last.started_at.timestamp():.0f}") if last
                   else AlertKind.NO_DAEMON.key(host, "never"))
            if key in self._alerted:
                continue
            last_tick = f"{last.last_tick_at:%Y-%m-%d %H:%M:%S} UTC" if last and last.last_tick_at else None
            said = Outcome.of(Say.NO_DAEMON, key, host=host, active_runs=t.role.active.get(host, 0),
                              last_pid=last.pid if last else None, last_tick=last_tick, by=self.by)
            with self.engine.begin() as conn:
                if not queued(conn, key):
                    announce(conn, said, now=t.now, sealer=self.sealer, audit=Audit(
                        Action.NO_DAEMON, self.by, detail=f"host {host}",
                        outcome="runs adopted: cooperative stops only, no signal"))
                    log.warning("host %s has no live daemon: adopting its %d active runs (cooperative stops only)",
                                one_line(host, 64), t.role.active.get(host, 0))
            self._alerted.add(key)

    def update_circuits(self, t: DutyTick) -> None:
        if self.circuits is not None:
            self.circuits.update(self.engine, t.new_events, t.now, t.scanner)

    def follow(self) -> None:
        """A tick this daemon did not lead: what ended meanwhile is sealed when it leads again."""
        self._sealed_all = False

    def seal(self, t: DutyTick) -> None:
        self._ended_since_seal = self._ended_since_seal or not t.none_ended
        if self._sealed_all:
            if not self._ended_since_seal:
                return  # no run ended since the last seal found none left
            last = self._last_seal_at
            if last is not None and 0 <= (t.now - last).total_seconds() < SEAL_EVERY_S:
                return  # the runs that ended since wait for the next batch (read from events until then)
        self._sealed_all = retention.seal_ended(self.engine) < retention.SEAL_BATCH
        self._last_seal_at, self._ended_since_seal = t.now, False

    def prune(self, t: DutyTick) -> None:
        keep_days = self.config.store.keep_days
        if not keep_days or (self._next_prune_at is not None and t.now < self._next_prune_at):
            return
        with read_connection(self.engine) as conn:
            cutoff = retention.cutoff_for(leases.db_now(conn), keep_days)
        budget_s = min(PRUNE_BUDGET_MAX_S, PRUNE_BUDGET_SHARE * self.config.daemon.tick_s)
        drop = self._next_drop_at is None or t.now >= self._next_drop_at
        rep = retention.prune(self.engine, cutoff, budget_s=budget_s, drop_partitions=drop)
        self.last_prune = rep
        if rep.partitions_busy:
            if self._next_drop_at is None:  # once, not at every retry
                log.warning("retention: %s stays whole for now: events is locked by an open transaction "
                            "(idle in transaction?); its rows are deleted one by one, the day is dropped later",
                            rep.partitions_busy)
            self._next_drop_at = t.now + dt.timedelta(seconds=PARTITION_DROP_RETRY_S)
        elif drop:
            self._next_drop_at = None
        if rep.runs or rep.events or rep.interventions or rep.alerts:
            log.info("retention: %s", rep.summary())
        self._next_prune_at = None if not rep.complete else t.now + dt.timedelta(seconds=PRUNE_EVERY_S)
