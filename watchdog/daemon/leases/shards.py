"""Judges sharded by run id (issue 35): several judges share the judging of one PostgreSQL store,
each judging the runs whose id hashes into the shards it holds. `[daemon] shards = N` makes
every `agent-watchdog run` of the store one judge (watchdog.daemon.process.service).

Each shard is held by a session-level advisory lock on a session of the judge's own (the
database's primitive: no row anyone can write says who judges what). Before each tick a judge
rebalances: it counts the judges present (their member locks), gives up shards beyond its fair
share (ceil(shards / judges)) and takes free ones up to it. A judge that dies loses its session
and its locks with it (its host's TCP keepalives bound how long the server takes to notice a
vanished host); the others take its shards at their next rebalance, within one tick. A judge
whose session broke judges nothing until it holds shards again.

What a judge reads (its `Reach`, watchdog.store.shards): the runs of its shards on every host,
and every run of its own hosts (its host, and the hosts it adopted as the leader). Both in SQL:
the change feed and the new events by their stored bucket (revision 0016), so a judge's tick
costs its part of what changed, not all of it. What it does with them:

* a *running* run of its shards is judged (budgets, silence, loops: the stop decided here);
* a run of its hosts, whoever's shard, is carried out here: its ladder once it is `stopping`
  (decided by any judge: the ladder confirms the stop by its own evidence before a signal, as
  for any stop it did not decide, watchdog.daemon.tick.stopping_runs), its pause, its process's
  end. Another host's stopping run is left to that host's daemon (or its adopter).

Each stop is still decided once whatever the timing: the decision is the store's conditional
move `running -> stopping` with its audit row (watchdog.store.run_rows.request_stop), which a
second decider finds already made. A judge that gains shards folds the history of the runs it
reads now and did not before (a cold fold of its Scanner), before it judges them: its counters
are whole. The leader (the cluster duties and the money) still reads every host's changed run
rows: the period budgets count another judge's run by its row's counters (monotonic on
PostgreSQL), the adoption counts runs per host. It folds only the events of its shards and its
own host, like any judge (watchdog.daemon.tick.tickread._folded; an adopted host's runs are
carried out from their rows), and reads every run's new events grouped by tool in the database
for the circuits, the all-runs tool rate and the unpriced steps (watchdog.daemon.tick.toolwatch).
"""

from __future__ import annotations

import functools
import logging
import math
from collections.abc import Callable
from typing import Any

from watchdog.core import lifecycle as lc
from watchdog.store.scan import LIGHT
from watchdog.store import leases
from watchdog.store import shards as store
from watchdog.store.engine import Engine
from watchdog.store.shards import Reach

log = logging.getLogger("watchdog.daemon")

DEFAULT_SHARDS = 64
KEEPALIVE_IDLE_S = 5


class ShardedPreFilter:
    """The Ticker's pre-filter (watchdog.daemon.tick.prefilter.PreFilter), its verdict confined to
    what this judge does: it still passes every run it reads (their live spend counts toward the
    period budgets whichever judge holds them); a running run comes out due only if it is of the
    held shards (or its process on this host is gone), any other run only if it is on the hosts
    this daemon carries out stops for (`judged`: its ladder, its pause). Only the held shards'
    runs get their deadlines queued. One object for as long as the config lasts: the tick's
    scope compares the pre-filter by identity."""

    def __init__(self, inner: Any, owns: Callable[[str], bool]) -> None:
        self.inner = inner
        self.owns = owns

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def due(self, light: Any, now: Any, live: set[int] | None, *args: Any, **kw: Any) -> list[str]:
        owns = self.owns
        hosts = kw.get("judged")
        kw["judged"] = None  # every run read is looked at; what comes out is confined below
        theirs = _theirs(light, owns, kw.get("host"))
        if theirs:  # (the leader: every host's rows) another judge's running runs: only their spend counted
            ids = self.inner.due(theirs, now, live, *args, **{**kw, "judged": frozenset()})
            ids += self.inner.due([r for r in light if id(r) not in theirs.ids], now, live, *args, **kw)
            if args and args[0] is not None:
                args[0].light = light  # (LiveSpend: the rows the pass read, all of them)
        else:
            ids = self.inner.due(light, now, live, *args, **kw)
        wake = kw.get("wake")
        if wake:
            for rid in [rid for rid in wake if not owns(rid)]:
                del wake[rid]
        return _confined(ids, light, live, owns, hosts, kw.get("host")) if ids else ids


_I_ID, _I_STATUS, _I_HOST, _I_PID = (LIGHT.index(k) for k in ("id", "status", "host", "pid"))


class _Theirs(list[Any]):
    ids: set[int]  # id() of each row in it


def _theirs(light: Any, owns: Callable[[str], bool], my_host: str | None) -> _Theirs:
    """The running runs of other judges' shards, not on this host: nothing of theirs comes out of
    the pre-filter here (_confined), so the pass only counts their live spend (the pre-filter's
    path for another host's run) and spares their budgets, deadlines and loop checks."""
    out = _Theirs(r for r in light if r[_I_STATUS] == lc.RUNNING and r[_I_HOST] != my_host and not owns(r[_I_ID]))
    out.ids = {id(r) for r in out}
    return out


def _confined(ids: list[str], light: Any, live: set[int] | None, owns: Callable[[str], bool],
              hosts: Any, my_host: str | None) -> list[str]:
    """Of the runs the pre-filter found due, those this judge acts on (ShardedPreFilter)."""
    wanted = set(ids)
    rows = {r[_I_ID]: r for r in light if r[_I_ID] in wanted}
    out = []
    for rid in ids:
        r = rows.get(rid)
        if r is None:
            continue
        here = hosts is None or r[_I_HOST] in hosts
        if r[_I_STATUS] != lc.RUNNING:
            if here:  # its ladder, its pause: its host's daemon's
                out.append(rid)
        elif owns(rid) or (here and live is not None and r[_I_HOST] == my_host and r[_I_PID] not in live):
            out.append(rid)  # its shard's, or its process here is gone (lost: only this host can tell)
    return out


class ShardSet:
    """The shards one judge holds, on its own PostgreSQL session."""

    def __init__(self, engine: Engine, n_shards: int = DEFAULT_SHARDS) -> None:
        if not leases.is_postgres(engine):
            raise ValueError("judges are sharded on PostgreSQL only (advisory locks)")
        self.engine = engine
        self.n = n_shards
        self.held: set[int] = set()
        # Shards whose lock key another login holds (a squat: the keys are public): judged here
        # anyway, by every judge (each stop is still decided once), never left unjudged.
        self.squatted: set[int] = set()
        self._reported: set[tuple[str, int, str]] = set()  # squats logged already
        self.slot: int | None = None
        self._conn: Any = None
        self._shard = functools.lru_cache(maxsize=1 << 18)(lambda rid: store.shard_of(rid, n_shards))

    @property
    def active(self) -> bool:
        """Judging by shard (a session: else it holds nothing and judges nothing)."""
        return self._conn is not None

    def reach(self, hosts: frozenset[str]) -> Reach:
        """What this judge reads: the runs of `hosts` and of its shards (held or squatted)."""
        return Reach(hosts, store.buckets_of(self.held | self.squatted, self.n))

    def owns(self, run_id: str) -> bool:
        """This judge holds the run's shard (the pre-filter's hook)."""
        if run_id.__class__ is not str:
            return False
        shard = self._shard(run_id)
        return shard in self.held or shard in self.squatted

    def _report(self, what: str, taken: dict[int, str]) -> None:
        """One warning per squatted key and login (by who holds it, never by a name it gives)."""
        new = {(what, i, who) for i, who in taken.items()} - self._reported
        if new:
            logins = sorted({who for _, _, who in new})
            log.warning("shards: %d %s lock keys are held by sessions of other logins (%s), not judges: "
                        "ignored, their runs are judged here anyway", len(new), what, ", ".join(logins))
            self._reported |= new

    def _snapshot(self) -> tuple[Any, store.Holders]:
        """The session and one read of the locks' holders on it: the rebalance's one round trip
        while the session lives (the read proves it, as a ping would; a read that fails on a
        session that lived ends it, and a new one is opened at once, its locks taken afresh)."""
        if self._conn is not None:
            try:
                return self._conn, store.Holders(self._conn)
            except Exception:  # noqa: BLE001 — the session is gone, and its locks with it
                log.warning("shards: the lock session broke; %d shards are no longer held", len(self.held))
                leases.end_session(self._conn)
                self._conn, self.held, self.squatted, self.slot = None, set(), set(), None
        conn = self._session()
        return conn, store.Holders(conn)

    def _session(self) -> Any:
        if self._conn is not None:
            return self._conn
        conn = leases.open_session(self.engine)
        leases.session_keepalives(conn, KEEPALIVE_IDLE_S)
        self.slot = store.join(conn)
        if self.slot is None:
            if store.judges(conn) >= store.MAX_JUDGES:
                leases.end_session(conn)
                raise RuntimeError(f"shards: more than {store.MAX_JUDGES} judges")
            # Every free slot squatted by another login: judge without one (the others do not
            # count this judge, so it takes fewer shards; every shard is still judged).
            self._report("member", store.squatted_members(conn))
        self._conn = conn
        return conn

    def rebalance(self) -> bool:
        """Give up shards beyond the fair share, take free ones up to it; True if the set changed."""
        before = (set(self.held), set(self.squatted))
        try:
            # One read of the holders answers every question below (it was four, and a ping):
            # the shards this judge takes or gives up after it are its own set's to tell.
            conn, holders = self._snapshot()
            present = holders.judges() + (1 if self.slot is None else 0)
            fair = math.ceil(self.n / max(1, present))
            for index in sorted(self.held, reverse=True)[:max(0, len(self.held) - fair)]:
                store.give_up(conn, index, self.n)
                self.held.discard(index)
            for index in holders.free_shards(self.n, self.held):
                if len(self.held) >= fair:
                    break
                if store.take(conn, index, self.n):
                    self.held.add(index)
            taken = holders.squatted(self.n)
            self.squatted = set(taken) - self.held
            self._report("shard", taken)
            self._report("member", holders.squatted_members())
        except Exception:  # noqa: BLE001 — the store is down: judge nothing rather than twice
            log.exception("shards: rebalance failed; holding none until the next")
            self.close()
        return (self.held, self.squatted) != before

    def before_tick(self, ticker: Any) -> None:
        """Rebalance and confine the ticker's reads and pre-filter to the held shards; a changed
        set makes the next tick a full one (the gained runs' deadlines were another judge's), and
        gained shards a cold fold (their runs' history was never folded here)."""
        before = self.held | self.squatted
        if self.rebalance():
            ticker.active.valid = False
            if (self.held | self.squatted) - before:
                ticker.scanner = type(ticker.scanner)()  # a cold fold of every run it reads now
        ticker.shards = self
        if not isinstance(ticker.prefilter, ShardedPreFilter):  # the first tick, or a reload made a new one
            ticker.prefilter = ShardedPreFilter(ticker.prefilter, self.owns)

    def close(self) -> None:
        if self._conn is not None:
            try:
                leases.unlock_all(self._conn)
            except Exception:  # noqa: BLE001 — gone already: so are its locks
                pass
            leases.end_session(self._conn)
        self._conn, self.held, self.squatted, self.slot = None, set(), set(), None
