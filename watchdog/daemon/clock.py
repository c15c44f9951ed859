"""Clock jumps: the store's clock against the monotonic one, between two ticks. Pure.

The tick's `now` is the store's clock (the database server's on PostgreSQL, this host's
on SQLite) and durations (wall_clock, heartbeat_timeout) are measured on it. When that
clock is stepped (an NTP correction, an operator's `date -s`, a VM restored), the
durations of that tick are false: +1 h makes every healthy run look an hour old, -1 h
makes a runaway look young. The monotonic clock cannot be stepped, so between two
readings the two deltas agree unless the clock jumped. (A suspended host also shows as
a jump: the monotonic clock stops while suspended. Not judging durations for one tick
after a resume is right too.)
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass


@dataclass(frozen=True)
class Jump:
    clock_delta_s: float  # how far the store's clock moved between the two readings
    monotonic_delta_s: float  # how much time really passed
    at: dt.datetime  # the second reading (after the jump)

    @property
    def skew_s(self) -> float:
        """Positive: the clock jumped forward by about this much; negative: backwards."""
        return self.clock_delta_s - self.monotonic_delta_s

    def describe(self) -> str:
        return (f"the clock jumped {self.skew_s:+.0f} s: it moved {self.clock_delta_s:+.1f} s while "
                f"{self.monotonic_delta_s:.1f} s passed")


class JumpDetector:
    """Feed it (monotonic seconds, clock reading) once per tick; it answers the jump since the
    previous reading, or None. `tolerance_s` (one tick): smaller disagreements are the time
    between the two readings (a slow query) rather than a step of the clock."""

    def __init__(self, tolerance_s: float):
        if not tolerance_s > 0:
            raise ValueError(f"tolerance_s: expected > 0, got {tolerance_s!r}")
        self.tolerance_s = float(tolerance_s)
        self._last: tuple[float, dt.datetime] | None = None

    def observe(self, monotonic_s: float, clock: dt.datetime) -> Jump | None:
        last, self._last = self._last, (monotonic_s, clock)
        if last is None:
            return None
        jump = Jump((clock - last[1]).total_seconds(), monotonic_s - last[0], clock)
        return jump if abs(jump.skew_s) > self.tolerance_s else None
