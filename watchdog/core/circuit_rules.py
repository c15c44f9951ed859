"""The circuit breaker's rules, pure: counts, states and the clock in, the next move out.

watchdog.daemon.stops.circuits reads the rows and the error window from the store, asks these
rules what to do, and writes and announces the move; keeping the rules here lets them be unit
tested with plain values (closed -> open -> half_open -> closed, or open again).
"""

from __future__ import annotations

import datetime as dt

from watchdog.core.lifecycle import Circuit


def window_start(now: dt.datetime, window_s: float, updated_at: dt.datetime | None) -> dt.datetime:
    """Where the error window begins: `window_s` back, but never before the circuit's last move
    (errors from before the last close were already paid for)."""
    since = now - dt.timedelta(seconds=window_s)
    return updated_at if updated_at is not None and updated_at > since else since


def opens(errors: int, threshold: int) -> bool:
    """A closed circuit opens when the window holds `threshold` errors or more."""
    return errors >= threshold


def probe_claimable(state: str, open_until: dt.datetime | None, now: dt.datetime) -> bool:
    """An SDK's probe claim counts: the circuit is half-open, or its open period is over."""
    return state == Circuit.HALF_OPEN or (open_until is not None and open_until <= now)


def half_opens(state: str, open_until: dt.datetime | None, now: dt.datetime) -> bool:
    """An open circuit whose open period is over lets one probe through."""
    return state == Circuit.OPEN and open_until is not None and now >= open_until


def probe_lost(probe_at: dt.datetime, now: dt.datetime, open_s: float) -> bool:
    """A claimed probe that never reported within `open_s`: its slot is freed for another."""
    return (now - probe_at).total_seconds() > open_s

