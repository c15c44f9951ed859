"""Judges sharded by run id (issue 35): several judges share the judging of one PostgreSQL store,
each judging the runs whose id hashes into the shards it holds.

Each shard is held by a session-level advisory lock on a session of the judge's own (the
database's primitive: no row anyone can write says who judges what). Before each tick a judge
rebalances: it counts the judges present (their member locks), gives up shards beyond its fair
share (ceil(shards / judges)) and takes free ones up to it. A judge that dies loses its session
and its locks with it (its host's TCP keepalives bound how long the server takes to notice a
vanished host); the others take its shards at their next rebalance, within one tick. A judge
whose session broke judges nothing until it holds shards again.

Each stop is still decided once whatever the timing: the decision is the store's conditional
move `running -> stopping` with its audit row (watchdog.store.stops.request_stop), which a
second decider finds already made. What sharding saves is the judging (the rows, snapshots and
policies of the held shards' runs only; the cheap pre-filter still passes every active run, whose
live spend the period budgets need); every judge still folds every event of the hosts
it reads (its counters must be whole when it takes a shard over). Wiring into `agent-watchdog
run` (a config key, one judge per process) and the judge/enforcer split across hosts are not
built yet: docs/explanation/scale.md.
"""

from __future__ import annotations

import functools
import logging
import math
from collections.abc import Callable
from typing import Any

from watchdog.store import leases
from watchdog.store import shards as store
from watchdog.store.engine import Engine

log = logging.getLogger("watchdog.daemon")

DEFAULT_SHARDS = 64
KEEPALIVE_IDLE_S = 5


class ShardedPreFilter:
    """The Ticker's pre-filter (watchdog.daemon.tick.prefilter.PreFilter), its verdict confined to the
    held shards: it still passes every active run (their live spend counts toward the period
    budgets whichever judge holds them), and only the held shards' runs come out due and get
    their deadlines queued. One object for as long as the config lasts: the tick's scope compares
    the pre-filter by identity."""

    def __init__(self, inner: Any, owns: Callable[[str], bool]) -> None:
        self.inner = inner
        self.owns = owns

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def due(self, light: Any, *args: Any, **kw: Any) -> list[str]:
        owns = self.owns
        ids = self.inner.due(light, *args, **kw)
        wake = kw.get("wake")
        if wake:
            for rid in [rid for rid in wake if not owns(rid)]:
                del wake[rid]
        return [rid for rid in ids if owns(rid)]


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

    def _session(self) -> Any:
        if self._conn is not None:
            try:
                leases.ping(self._conn)
                return self._conn
            except Exception:  # noqa: BLE001 — the session is gone, and its locks with it
                log.warning("shards: the lock session broke; %d shards are no longer held", len(self.held))
                leases.end_session(self._conn)
                self._conn, self.held, self.squatted, self.slot = None, set(), set(), None
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
            conn = self._session()
            present = store.judges(conn) + (1 if self.slot is None else 0)
            fair = math.ceil(self.n / max(1, present))
            for index in sorted(self.held, reverse=True)[:max(0, len(self.held) - fair)]:
                store.give_up(conn, index, self.n)
                self.held.discard(index)
            for index in store.free_shards(conn, self.n, self.held):
                if len(self.held) >= fair:
                    break
                if store.take(conn, index, self.n):
                    self.held.add(index)
            taken = store.squatted(conn, self.n)
            self.squatted = set(taken) - self.held
            self._report("shard", taken)
            self._report("member", store.squatted_members(conn))
        except Exception:  # noqa: BLE001 — the store is down: judge nothing rather than twice
            log.exception("shards: rebalance failed; holding none until the next")
            self.close()
        return (self.held, self.squatted) != before

    def before_tick(self, ticker: Any) -> None:
        """Rebalance and confine the ticker's pre-filter to the held shards; a changed set makes
        the next tick a full one (the gained runs' deadlines were another judge's)."""
        if self.rebalance():
            ticker.active.valid = False
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
