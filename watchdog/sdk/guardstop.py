"""The SQL an in-process guard trip writes: a stop request on the run's own row, nothing else.

running → stopping with the guard's reason. The SDK composes no alert and writes
no audit row: the daemon sees a stop it did not request, records it and words
the alert itself from the store's numbers (an agent, or anyone who can write
the store, can ask for a stop; only the daemon speaks to humans).
Kept out of the per-record hot path: it runs once per run at most.
"""

from __future__ import annotations

import datetime as dt
from typing import TYPE_CHECKING

from watchdog.core import lifecycle as lc

if TYPE_CHECKING:
    from watchdog.errors import RunKilled
    from watchdog.sdk.client import Statement
    from watchdog.sdk.run import Run


def statements(run: Run, stop: RunKilled, now: dt.datetime) -> list[Statement]:
    d = run.wd.writer.dialect
    ph = d.ph
    return [
        (f"UPDATE runs SET status = {ph}, stop_reason = {ph}, stop_detail = {ph}, stop_requested_at = {d.clock_ph} "
         f"WHERE id = {ph} AND status = {ph}",
         (lc.STOPPING, stop.reason, stop.detail, d.seen(now), run.id, lc.RUNNING)),
    ]
