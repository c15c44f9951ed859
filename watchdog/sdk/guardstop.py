"""The SQL an in-process guard trip writes: a stop request on the run's own row, nothing else.

running → stopping with the guard's reason. The SDK composes no alert and writes
no audit row: the daemon sees a stop it did not request, records it and words
the alert itself from the store's numbers (an agent, or anyone who can write
the store, can ask for a stop; only the daemon speaks to humans).
Kept out of the per-record hot path: it runs once per run at most.
"""

from __future__ import annotations

from watchdog.core import lifecycle as lc


def statements(run, stop, now) -> list:
    d = run.wd.writer.dialect
    ph = d.ph
    return [
        (f"UPDATE runs SET status = {ph}, stop_reason = {ph}, stop_detail = {ph}, stop_requested_at = {d.clock_ph} "
         f"WHERE id = {ph} AND status = {ph}",
         (lc.STOPPING, stop.reason, stop.detail, d.seen(now), run.id, lc.RUNNING)),
    ]
