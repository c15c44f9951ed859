"""The events that may still commit below the fold's high-water mark (PostgreSQL).

The fold reads the events above the newest id it read (watchdog.daemon.trust.scan). On PostgreSQL a
transaction takes its event's id from the sequence, then commits when it commits: an event with
a lower id than one already folded can still appear. The fold therefore checks a window below
its mark each tick: the count and id sum of the folded events there (one row) against those of
the ids it read there, and reads the ids only when they differ.

How far down may a late event land? Not a number of ids: any writer moves the sequence on (its
own inserts, `nextval`), and a transaction can wait on a lock for as long as another holds it.
So the window's bottom is bounded by the transactions themselves. Each fold's check also takes
the read's own transaction id (pg_current_xact_id: above every id given before it) and the
snapshot's oldest transaction still running (pg_snapshot_xmin: every older one has ended). The
ids at or below a fold's mark are final once the oldest running transaction is past the id the
*next* fold took: one fold of margin, for a transaction that took its event id just before a
snapshot and its transaction id just after (a writer that stalls its own INSERT between the two
for longer than a tick can hide only its own event). The window is never narrower than
ID_OVERLAP ids. While a transaction stays open the window stays open below it, at the cost of a
count over it each tick and its ids in memory; past MAX_WINDOW_EVENTS folded events that is
logged and the oldest part given up (idle_in_transaction_session_timeout bounds such sessions).
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Collection

from watchdog.store import scan as store
from watchdog.store.engine import Connection
from watchdog.store.shards import Reach

log = logging.getLogger("watchdog.tick")

ID_OVERLAP = 2000  # the window's least width, in ids
MAX_WINDOW_EVENTS = 1_000_000  # ...and the most folded events it keeps (~60 bytes each)


def _key(hosts: Collection[str] | None) -> frozenset[str] | None:
    """Whose events: a sharded judge's Reach as it is (its buckets count), other hosts as a set."""
    return hosts if hosts is None or isinstance(hosts, Reach) else frozenset(hosts)


class LateWindow:
    """The window below the fold's mark (a Scanner's, on PostgreSQL). Not thread-safe (the tick's)."""

    def __init__(self) -> None:
        self._seen: set[int] = set()  # the ids read in the window...
        self._n, self._sum = 0, 0  # ...their count and sum
        self._hosts: frozenset[str] | None = None  # whose events `_seen` holds
        self._low = 0  # every id at or below it is final
        self._kept_above = 0  # `_seen` holds no id at or below this
        self._folds: deque[tuple[int, int]] = deque()  # (the fold's own transaction id, its mark)
        self._snapshot: tuple[int, int] | None = None  # this fold's (oldest running, own id)
        self._warned = False

    def bottom(self, high: int) -> int:
        return max(0, min(self._low, high - ID_OVERLAP))

    def start(self, conn: Connection, high: int, hosts: Collection[str] | None) -> None:
        """A cold start at `high`: the window's ids as they are now."""
        self._low, self._folds, self._snapshot = max(0, high - ID_OVERLAP), deque(), None
        self._hosts = _key(hosts)
        self._set(set(store.folded_ids_between(conn, self._low, high, hosts)), self._low)

    def late(self, conn: Connection, high: int, hosts: Collection[str] | None,
             check: store.WindowSum | None = None) -> list[int]:
        """The ids in the window the fold has not read (committed since it passed them). `check`:
        folded_sum_between(bottom(high), high, hosts) as the caller read it in this snapshot (with
        another read, in one round trip)."""
        low = self.bottom(high)
        self._keep_above(low)
        if check is None:
            check = store.folded_sum_between(conn, low, high, hosts)
        self._snapshot = None if check.xmin is None or check.xid_bound is None else (check.xmin, check.xid_bound)
        hosts_key = _key(hosts)
        # Equal count and sum prove nothing new only while every id read there is still counted:
        # after other hosts (the leadership changed) or a mismatch (an event deleted, or one late)
        # the ids are read, and the seen ones kept only where they still are.
        if hosts_key == self._hosts and (check.n, check.total) == (self._n, self._sum):
            return []
        self._hosts = hosts_key
        ids = store.folded_ids_between(conn, low, high, hosts)
        present = set(ids)
        self._set({i for i in self._seen if i in present}, low)
        return [i for i in ids if i not in self._seen]

    def moved(self, high: int, read: list[int]) -> None:
        """After the fold: the ids it read, its new mark; what has become final leaves the window."""
        for i in read:
            if i > self._kept_above and i not in self._seen:
                self._seen.add(i)
                self._n += 1
                self._sum += i
        if self._snapshot is not None:
            oldest_running, own_id = self._snapshot
            self._folds.append((own_id, high))
            while len(self._folds) >= 2 and self._folds[1][0] <= oldest_running:
                self._low = max(self._low, self._folds.popleft()[1])
        self._keep_above(self.bottom(high))
        # A transaction held open while a million events were written: the oldest part goes (never
        # the newest fold's), logged.
        while self._n > MAX_WINDOW_EVENTS and len(self._folds) >= 2:
            if not self._warned:
                self._warned = True
                log.warning("a PostgreSQL transaction has stayed open over %d events; events it commits from now "
                            "on are not folded (idle_in_transaction_session_timeout bounds such sessions)",
                            MAX_WINDOW_EVENTS)
            self._low = max(self._low, self._folds.popleft()[1])
            self._keep_above(self.bottom(high))
        if self._n <= MAX_WINDOW_EVENTS // 2:
            self._warned = False

    def _keep_above(self, low: int) -> None:
        """Forget the ids at or below `low` (only when the bottom moved: no pass per tick)."""
        if low > self._kept_above:
            self._set({i for i in self._seen if i > low}, low)

    def _set(self, seen: set[int], low: int) -> None:
        self._seen, self._n, self._sum, self._kept_above = seen, len(seen), sum(seen), low
