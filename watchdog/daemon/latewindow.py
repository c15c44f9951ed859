"""The events that may still commit below the fold's high-water mark (PostgreSQL).

The fold reads the events above the newest id it read (watchdog.daemon.scan). On PostgreSQL a
transaction takes its event's id from the sequence, then commits when it commits: an event with
a lower id than one already folded can still appear. The fold therefore checks a window below
its mark each tick: the count and id sum of the folded events there (one row) against those of
the ids it read there, and reads the ids only when they differ.

How far down may a late event land? Not a number of ids: any writer moves the sequence on (its
own inserts, `nextval`), and a transaction can wait on a lock for as long as another holds it.
So the window's bottom is bounded by the transactions themselves: after each fold it remembers
(the first transaction its snapshot had not seen start, the high-water mark). The ids at or
below a fold's mark are final once every transaction in flight at the fold after it has ended
(the read snapshot's oldest transaction still running is past the later fold's first unseen
one): one fold of margin, so that a transaction that took its id just before a snapshot and its
transaction id just after is still waited for. The window is never narrower than ID_OVERLAP ids,
and never holds more than MAX_WINDOW_EVENTS folded events: a transaction held open while that
many were written (a writer idling in one) is logged, and events it commits later than that are
not folded (the row's counters still count). Ids alone cost nothing: a writer's `nextval` moves
the sequence on without a row.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Collection

from watchdog.store import scan as store
from watchdog.store.engine import Connection

log = logging.getLogger("watchdog.tick")

ID_OVERLAP = 2000  # the window's least width, in ids
MAX_WINDOW_EVENTS = 200_000  # ...and the most folded events it keeps (~60 bytes each, and a count per tick)


class LateWindow:
    """The window below the fold's mark (a Scanner's, on PostgreSQL). Not thread-safe (the tick's)."""

    def __init__(self) -> None:
        self.seen: set[int] = set()  # the ids read in the window
        self._hosts: frozenset[str] | None = None  # whose events `seen` holds
        self._low = 0  # every id at or below it is final
        self._folds: deque[tuple[int, int]] = deque()  # (first transaction unseen, mark) per fold
        self._snapshot: tuple[int, int] | None = None  # this fold's (oldest running, first unseen)
        self._warned = False

    def bottom(self, high: int) -> int:
        return max(0, min(self._low, high - ID_OVERLAP))

    def start(self, conn: Connection, high: int, hosts: Collection[str] | None) -> None:
        """A cold start at `high`: the window's ids as they are now."""
        self._low, self._folds, self._snapshot = max(0, high - ID_OVERLAP), deque(), None
        self._hosts = None if hosts is None else frozenset(hosts)
        self.seen = set(store.folded_ids_between(conn, self._low, high, hosts))

    def late(self, conn: Connection, high: int, hosts: Collection[str] | None) -> list[int]:
        """The ids in the window the fold has not read (committed since it passed them)."""
        low, seen = self.bottom(high), self.seen
        check = store.folded_sum_between(conn, low, high, hosts)
        self._snapshot = None if check.xmin is None or check.xmax is None else (check.xmin, check.xmax)
        hosts_key = None if hosts is None else frozenset(hosts)
        inside = [i for i in seen if i > low]
        # Equal count and sum prove nothing new only while every id read there is still counted:
        # after other hosts (the leadership changed) or a mismatch (an event deleted, or one late)
        # the ids are read, and the seen ones kept only where they still are.
        if hosts_key == self._hosts and (check.n, check.total) == (len(inside), sum(inside)):
            return []
        self._hosts = hosts_key
        ids = store.folded_ids_between(conn, low, high, hosts)
        present = set(ids)
        self.seen = {i for i in seen if i in present}
        return [i for i in ids if i not in self.seen]

    def moved(self, high: int, read: list[int]) -> None:
        """After the fold: the ids it read, its new mark; what has become final leaves the window."""
        self.seen.update(read)
        if self._snapshot is not None:
            oldest_running, first_unseen = self._snapshot
            self._folds.append((first_unseen, high))
            while len(self._folds) >= 2 and self._folds[1][0] <= oldest_running:
                self._low = max(self._low, self._folds.popleft()[1])
        self._keep_above(self.bottom(high))
        # Its cost is the events in it, not its ids (a writer's nextval moves those for nothing).
        while len(self.seen) > MAX_WINDOW_EVENTS and self._folds:
            if not self._warned:
                self._warned = True
                log.warning("a PostgreSQL transaction has stayed open over %d events; events it commits from now "
                            "on are not folded (idle_in_transaction_session_timeout bounds such sessions)",
                            MAX_WINDOW_EVENTS)
            self._low = max(self._low, self._folds.popleft()[1])
            self._keep_above(self.bottom(high))
        if len(self.seen) <= MAX_WINDOW_EVENTS // 2:
            self._warned = False

    def _keep_above(self, low: int) -> None:
        self.seen = {i for i in self.seen if i > low}
