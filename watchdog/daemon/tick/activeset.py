"""The active runs a daemon keeps between ticks, so that a tick costs what changed (issue 25).

A *full* tick reads every active run's light row and passes all of them through the
pre-filter: O(active runs), 10,000 rows each tick for a daemon whose runs mostly wait on
their models. Between full ticks the Ticker keeps those rows here and an *incremental* tick
looks only at the runs that may need something:

* the runs the change feed numbers above its cursor (watchdog.store.changes: every write of a
  run row and every event of a run renumbers it, by the database's triggers);
* the runs whose deadline came (watchdog.daemon.tick.duequeue: when the wall clock or the silence
  of a run that writes nothing will make it due, as the pre-filter computed it);
* the runs whose process ended (watchdog.daemon.stops.liveness: a pidfd per local process);
* the runs that were due or could not be read at the last look ("sticky": a run over budget,
  stopping, paused or quarantined is looked at every tick, as before).

Every other run costs its place in the queue. The period budgets still count every run's
live cost: `SpendIndex` (watchdog.daemon.money.spendindex) keeps each one's, updated for the runs
looked at, and a running total per agent and label budget (no Python per run). What stays
O(active) per tick is a list of the kept rows (a pointer copy) and the process table's pids.

Nothing here is trusted across what it cannot see: a full tick rebuilds it all from the store
at the first tick, after a tick that failed, when the hosts judged or the leadership or the
config change, when the clock jumps or goes back, when the feed meets a row it cannot read,
when most runs changed anyway, and every FULL_EVERY_S as a backstop (a writer that bypassed
the feed's triggers is then seen within that time, as it was each tick before).
"""

from __future__ import annotations

import logging
import math
from collections import Counter
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from operator import itemgetter
from typing import TYPE_CHECKING, Any

from watchdog.core.deadlines import Deadline
from watchdog.daemon.tick.duequeue import DueQueue
from watchdog.daemon.trust.scan import L
from watchdog.daemon.money.spendindex import SpendIndex
from watchdog.store import scan as store_scan
from watchdog.store.changes import ChangeFeed
from watchdog.store.shards import Reach
from watchdog.store.engine import Connection

if TYPE_CHECKING:
    from watchdog.daemon.stops.killer import Killer
    from watchdog.daemon.stops.liveness import Liveness

log = logging.getLogger("watchdog.tick")

# The backstop: a full tick at least this often, whatever the feed says.
FULL_EVERY_S = 60.0
# More changed runs than this share of the active ones: one full read is cheaper than reads by id.
MOSTLY_CHANGED = 0.5
# The largest pid Linux gives (PID_MAX_LIMIT, 2**22): a row's larger pid names no process, and
# would overflow pidfd_open.
MAX_PID = 4_194_304

_ID, _AGENT, _HOST, _PID, _CTIME = L["id"], L["agent"], L["host"], L["pid"], L["pid_create_time"]
_HOST_OF, _PROC_OF = itemgetter(_HOST), itemgetter(_HOST, _PID)  # a row's host, its (host, pid)


@dataclass(frozen=True)
class Scope:
    """What a tick reads and judges; a change of any of it makes the next tick full."""

    # the hosts whose runs it reads (None: every host: the leader's money); a sharded judge's
    # Reach (watchdog.store.shards): its hosts' runs and, on any host, its shards'
    hosts: frozenset[str] | None
    judged: frozenset[str] | None  # the hosts whose runs it judges (None: every host; a Reach: as `hosts`)
    config: object  # the pre-filter, compared by identity (a new one per config: SIGHUP changes the budgets)


class ActiveSet:
    """The Ticker's picture of the active runs between full ticks. Not thread-safe (the tick's)."""

    def __init__(self, killer: Killer, *, use_pidfd: bool = True) -> None:
        self._killer = killer
        self.host = killer.host
        self._use_pidfd = use_pidfd
        self.rows: dict[str, Any] = {}  # run id -> its light row (watchdog.store.scan.LIGHT), every host read
        self.mine: set[str] = set()  # those on the hosts this daemon judges
        self.by_host: Counter[str] = Counter()  # host -> its runs in `rows`
        # (host, pid) -> its runs in `rows`: the ladder's "runs sharing the process", kept here so
        # that a tick with a stopping run does not count every active run's process again
        self.by_proc: Counter[tuple[Any, Any]] = Counter()
        self.quiet = False  # this tick's feed named no run: nothing was written to any run since the last
        self.none_ended = False  # no run the feed named has left the active ones (none ended, none deleted)
        self.local_quiet = False  # nor was any run of this host named (the exec roots hold: watchdog.daemon.stops.exectree)
        self.feed = ChangeFeed()
        self.queue = DueQueue()
        self.sticky: set[str] = set()  # due or unreadable at the last look: looked at every tick
        self.dead: set[str] = set()  # their process ended (liveness): looked at until they end
        self.spend = SpendIndex()
        self.liveness: Liveness | None = None
        self.valid = False  # False: the next tick is full (set by the Ticker once a tick went through)
        self._scope: Scope | None = None
        self._full_s = 0.0
        self._last_s: float | None = None

    # -- which kind of tick ----------------------------------------------------------------

    def host_counts(self) -> Mapping[str, int] | None:
        """The active runs per host at the last read, when it read every host's (else None)."""
        if not self.valid or self._scope is None or self._scope.hosts is not None:
            return None
        return self.by_host

    def full_reason(self, now_s: float, scope: Scope, skip_clock: bool) -> str | None:
        """Why this tick must read every active run (None: it may look only at what changed)."""
        if not self.valid:
            return "first tick, or the last one failed"
        if skip_clock:
            return "the clock jumped"
        if scope != self._scope:
            return "the hosts judged, the leadership or the config changed"
        if self._last_s is not None and now_s < self._last_s:
            return "the clock went back"
        if now_s - self._full_s >= FULL_EVERY_S:
            return "backstop"
        return None

    def changes(self, conn: Connection, scope: Scope) -> set[str] | None:
        """In the tick's read snapshot: the runs the feed says changed, their light rows read
        again (those no longer active, or on a host not read, leave). Returns the ids of those
        still here; None when the tick must read everything instead (a row the feed could not
        read, or most runs changed anyway)."""
        fresh, ids, ended, unreadable, high_water = store_scan.changed_light(conn, self.feed, scope.hosts)
        if unreadable:
            return None
        self.quiet, self.none_ended = not ids, not ended
        if self.quiet and high_water < self.feed.cursor:
            # Numbers went back (a writer rewound the counter, or retention pruned the newest): a
            # change numbered below the cursor would never be read. Read everything, start over.
            return None
        if len(fresh) > MOSTLY_CHANGED * len(self.rows) + 100:  # (the hosts this daemon reads only)
            return None
        kept: set[str] = set()
        local, rows = self.host, self.rows
        touched_here = False
        for r in fresh:
            rid = r[_ID]
            if rid.__class__ is str:
                kept.add(rid)
                if not touched_here:
                    old = rows.get(rid)
                    touched_here = r[_HOST] == local or (old is not None and old[_HOST] == local)
                self._put(r, scope.judged)
        for rid in ids - kept:
            old = rows.get(rid)
            touched_here = touched_here or (old is not None and old[_HOST] == local)
            self._drop(rid)
        self.local_quiet = not touched_here
        return kept

    def candidates(self, now_s: float, changed: Collection[str]) -> list[Any]:
        """The light rows of the runs this incremental tick looks at, in id order."""
        ids = set(changed)
        ids.update(d.run_id for d in self.queue.pop_due(now_s))
        if self.liveness is not None:
            self.dead.update(self.liveness.dead())
        ids.update(self.sticky)
        ids.update(self.dead)
        rows = self.rows
        return [rows[rid] for rid in sorted(ids) if rid in rows]

    # -- after the pre-filter ----------------------------------------------------------------

    def rebuild(self, light: Sequence[Any], scope: Scope, now_s: float, *, wake: Mapping[str, Deadline],
                due: Collection[str], costs: Mapping[str, float] | None,
                covered: Mapping[str, tuple[str, ...]] | None) -> None:
        """After a full read's pre-filter (and the money's read): everything from what it read."""
        # Each row in `rows` before _put sees it: _put finds it kept (same host and pid) and
        # leaves the counts alone, counted below in one pass each (no Python call per run).
        self.rows = rows = {r[_ID]: r for r in light if r[_ID].__class__ is str}
        self.mine, self.dead = set(), set()
        self.by_host, self.quiet, self.none_ended, self.local_quiet = Counter(), False, False, False
        self.by_proc = Counter()
        self.spend = SpendIndex()
        for r in light:
            if r[_ID].__class__ is str:
                self._put(r, scope.judged)
        self.by_host = Counter(map(_HOST_OF, rows.values()))
        self.by_proc = Counter(map(_PROC_OF, rows.values()))
        if self.liveness is not None:
            self.liveness.keep(self.rows)
        self.queue.load((rid, d) for rid, d in wake.items() if rid in self.rows)
        self.sticky = {rid for rid in due if rid in self.rows}
        if costs is not None:
            self.spend_looked((), costs, covered)
        self._scope, self._full_s = scope, now_s

    def spend_looked(self, looked: Collection[str], costs: Mapping[str, float],
                     covered: Mapping[str, tuple[str, ...]] | None) -> list[tuple[str, float]]:
        """The live cost of the runs the pre-filter looked at, as it counted them (`costs`).
        Returns (run id, cost) of those whose label budgets are not known yet (LiveSpend.new)."""
        spend, rows = self.spend, self.rows
        for rid in looked:
            if rid not in costs:
                spend.drop(rid)  # unreadable now: it counts nothing, as in a full pass
        return spend.put_many(((rid, r[_AGENT], cost) for rid, cost in costs.items()
                               if (r := rows.get(rid)) is not None), covered)

    def settle(self, looked: Collection[str], *, wake: Mapping[str, Deadline], due: Collection[str],
               unreadable: Collection[str | None]) -> None:
        """At the end of a tick: the next deadline of each run looked at, and which runs stay
        sticky (due, or found unreadable anywhere in the tick)."""
        queue = self.queue
        for rid in looked:
            d = wake.get(rid)
            if d is None or not math.isfinite(d.at_s):  # no such time (an infinite budget): no deadline
                queue.discard(rid)
            else:
                queue.reschedule(rid, (d,))
        rows = self.rows
        self.sticky = {rid for rid in due if rid in rows}
        self.sticky.update(rid for rid in unreadable if isinstance(rid, str) and rid in rows)

    def ticked(self, now_s: float) -> None:
        self._last_s = now_s
        self.valid = True

    # -- the cache -------------------------------------------------------------------------

    def _put(self, r: Any, judged: frozenset[str] | None) -> None:
        rid = r[_ID]
        old = self.rows.get(rid)
        self.rows[rid] = r
        # Most changed rows keep their host and pid (new events, same process): their counts stay.
        # (Counter's del and a missing key's += are Python calls: a few per changed row, every tick.)
        if old is None or old[_HOST] != r[_HOST] or old[_PID] != r[_PID]:
            self._recount(old, r)
        if judged is None or r[_HOST] in judged or (isinstance(judged, Reach) and judged.covers(rid, r[_HOST])):
            self.mine.add(rid)  # (a sharded judge's: its hosts' runs and its shards')
        else:
            self.mine.discard(rid)
        pid, ctime = r[_PID], r[_CTIME]
        if old is not None and (old[_PID], old[_CTIME]) != (pid, ctime):
            self.dead.discard(rid)  # another process now: its own end is what counts
        if r[_HOST] == self.host and pid.__class__ is int and 0 < pid <= MAX_PID and isinstance(ctime, float):
            self._watch(rid, pid, ctime)
        elif self.liveness is not None:
            self.liveness.unwatch(rid)

    def _recount(self, old: Any, r: Any) -> None:
        """A run's row moved to another (host, pid), or is new: the counts by host and process."""
        if old is not None:
            self.by_host[old[_HOST]] -= 1
            self._unproc(old)
        self.by_host[r[_HOST]] += 1
        self.by_proc[(r[_HOST], r[_PID])] += 1

    def _unproc(self, old: Any) -> None:
        key = (old[_HOST], old[_PID])
        n = self.by_proc[key] - 1
        if n > 0:
            self.by_proc[key] = n
        else:
            del self.by_proc[key]

    def _drop(self, rid: str) -> None:
        old = self.rows.pop(rid, None)
        if old is not None:
            self.by_host[old[_HOST]] -= 1
            self._unproc(old)
        self.mine.discard(rid)
        self.queue.discard(rid)
        self.sticky.discard(rid)
        self.dead.discard(rid)
        self.spend.drop(rid)
        if self.liveness is not None:
            self.liveness.unwatch(rid)

    def _watch(self, rid: str, pid: int, ctime: float) -> None:
        try:
            if self.liveness is None:
                from watchdog.daemon.stops.liveness import Liveness

                self.liveness = Liveness(self._killer, use_pidfd=self._use_pidfd)
            self.liveness.watch(rid, pid, ctime)
        except Exception as exc:  # noqa: BLE001 — any row's pid: no watch, the full tick's process check finds it
            log.debug("cannot watch process %d of run %s: %s", pid, rid[:8], type(exc).__name__)

    def close(self) -> None:
        if self.liveness is not None:
            self.liveness.close()
            self.liveness = None
