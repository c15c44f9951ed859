"""What the tick believes of one run's row (issue 20): its snapshot, budgets, facts and pause,
each from the daemon's own records where the row is only a claim (watchdog.daemon.trust.trust)."""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Sequence
from typing import TYPE_CHECKING

from watchdog.core import lifecycle as lc
from watchdog.core.budgets import Budgets, effective_budgets
from watchdog.core.messages import RunFacts
from watchdog.core.policies import RunSnapshot, totals
from watchdog.core.rowviews import RunView
from watchdog.daemon.trust.evidence import merged
from watchdog.daemon.stops.stopping import facts

if TYPE_CHECKING:
    from watchdog.daemon.tick.batch import Batch
    from watchdog.daemon.context import TickContext


def snapshot(tk: TickContext, row: RunView, now: dt.datetime) -> RunSnapshot:
    """The run judged by the larger counters and its age from first sight at the latest."""
    return tk.scanner.snapshot(row, now, started_at=tk.trust.started_at(row))


def budgets(tk: TickContext, row: RunView, batch: Batch) -> Budgets:
    """Profile (or [defaults] for an owner it does not bind), clamped unless a sealed resume raised it."""
    prof = tk.config.profile(row.agent)
    # (A span run's profile is its sender's to use: an anonymous sender's never is; trust says.)
    if not row.resumes and not getattr(prof, "owners", ()) and getattr(row, "source", None) != lc.Source.OTLP:
        return effective_budgets(prof, row)  # no resume: never raised
    return tk.trust.budgets(batch.run, row)


def run_facts(tk: TickContext, row: RunView, top: tuple[str, int, int] | None, last_error: str | None,
              now: dt.datetime) -> RunFacts:
    """What alerts say of the run: its counters the larger of the row's and the daemon's, its
    duration from first sight at the latest."""
    f = facts(row, top, last_error, now)
    folded = tk.scanner.evidence.get(row.id)
    start = tk.trust.started_at(row)
    end = row.ended_at or now
    duration_s = max(0.0, (end - start).total_seconds()) if start is not None else f.duration_s
    if folded is None and duration_s == f.duration_s:
        return f
    steps, calls, errors, tokens, cost = merged((f.steps, f.tool_calls, f.tool_errors, f.tokens, f.cost_eur), folded)
    return dataclasses.replace(f, steps=steps, tool_calls=calls, tool_errors=errors, tokens=tokens, cost_eur=cost,
                               duration_s=duration_s)


def pause_is_known(tk: TickContext, row: RunView, now: dt.datetime, budgets: Budgets) -> bool:
    """The daemon paused this run, or confirms its guard's pause (a pausing budget at its
    limit by the daemon's own counters): remembered in its state file."""
    if tk.trust.pause_mark(row.id, row.resumes) is not None:
        return True
    if tk.trust.confirms_pause(row, totals(snapshot(tk, row, now), now), budgets):
        tk.trust.mark_pause(row.id, row.resumes, now.timestamp())
        return True
    return False


def unclaimed_pause(tk: TickContext, row: RunView, now: dt.datetime, batch: Batch) -> RunView | None:
    """A paused row whose pause the daemon neither wrote nor confirms: denied (running again);
    the row read again, or None when it is no longer paused."""
    if row.status != lc.PAUSED:
        return None
    with batch.run() as conn:
        again: RunView | None = tk.trust.deny_pause(conn, row, now)  # store.pause.deny_pause: a Row or None
        return again
