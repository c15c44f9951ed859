"""How a run seen only through spans ends when they stop: by silence, as DESIGN.md says.

A span-only run (`source = "otlp"`) has no process to watch and no writer to say it is done:
after `heartbeat_timeout_s` without a span it ends as `completed`, with no alert (the next
span starts a new run) — not `heartbeat_timeout`, which is for a run whose writer went quiet.
A stopped one that nobody could signal ends as `killed` once its spans stop arriving.
Called by the tick for each run it evaluates (watchdog.daemon.tick.ticker), before its policies.
"""

from __future__ import annotations

import datetime as dt
from typing import TYPE_CHECKING, Callable

from watchdog.core import lifecycle as lc
from watchdog.core.budgets import Budgets
from watchdog.core.rowviews import RunView
from watchdog.store import witness

if TYPE_CHECKING:
    from watchdog.daemon.tick.judging import Batch

# The sources whose runs end by silence: witnesses outside the run's process.
# A coding CLI's hook session (source hook) is one too: nothing says when a human left the
# terminal, and an idle session is not a hung agent (no heartbeat_timeout alert).
SPAN_ONLY = frozenset({lc.Source.OTLP, lc.Source.HOOK})


def silent(row: RunView, budgets: Budgets, now: dt.datetime) -> bool:
    """A span-only run that has been silent past its heartbeat timeout (pure)."""
    if row.source not in SPAN_ONLY or row.last_seen_at is None:
        return False
    limit = budgets.heartbeat_timeout_s
    limit = 120.0 if limit is None else limit
    return bool((now - row.last_seen_at).total_seconds() >= limit)  # never after heartbeat_timeout would judge it


def end_if_silent(batch: Batch, row: RunView, budgets: Budgets, now: dt.datetime, by: str,
                  gone: Callable[[], bool] | None = None) -> bool:
    """End the run if it is a silent span-only run; True when it was ended (nothing more to judge).
    `gone`: whether its pinned sender's process is gone (kill_mode process): a running span-only
    run whose sender exited without its root span is done, not lost (spans end when work ends)."""
    if row.source not in SPAN_ONLY:
        return False
    if row.status == lc.RUNNING and row.pid and gone is not None and gone():
        with batch.run() as conn:
            return witness.complete(conn, row.id, now=now)
    if not silent(row, budgets, now):
        return False
    with batch.run() as conn:
        if row.status == lc.RUNNING:
            return witness.complete(conn, row.id, now=now)
        if row.status == lc.STOPPING and row.signal_stage in lc.WAITING_STAGES:
            silent_s = (now - row.last_seen_at).total_seconds()
            return witness.end_stopped(conn, row.id, now=now, by=by,
                                       outcome=f"no span for {silent_s:.0f} s after the stop: its spans stopped")
    return False
