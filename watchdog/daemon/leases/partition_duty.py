"""The leader's duty of making the next day partitions of `events` (PostgreSQL, revision 0015).

Every PARTITIONS_EVERY_S of the store's time, and at the first tick this daemon leads: cheap
(one catalogue read when the partitions are there), idempotent, and DAYS_AHEAD days ahead, so
a leader that is down for a day still finds today's partition made. Rows for a day nobody made
land in the default partition and move into the day's partition when it is made.
"""

from __future__ import annotations

import datetime as dt
import logging
from typing import Protocol

from watchdog.store import partitions
from watchdog.store.engine import Engine

log = logging.getLogger("watchdog.daemon")

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
                log.warning("events: the next day partitions wait: events is locked by an open transaction "
                            "(idle in transaction?); tried again in %.0f s (rows land in %s meanwhile)",
                            PARTITIONS_BUSY_RETRY_S, partitions.DEFAULT)
            self._busy = True
            self._next_at = t.now + dt.timedelta(seconds=PARTITIONS_BUSY_RETRY_S)
        else:
            self._busy = False
            self._next_at = t.now + dt.timedelta(seconds=PARTITIONS_EVERY_S)
        if made:
            log.info("events: made day partitions %s", ", ".join(made))
