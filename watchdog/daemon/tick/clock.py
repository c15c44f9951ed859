"""Clock jumps: the store's clock against the monotonic one, between two ticks. Pure.

The tick's `now` is the store's clock (the database server's on PostgreSQL, this host's
on SQLite) and durations (wall_clock, heartbeat_timeout) are measured on it. When that
clock is stepped (an NTP correction, an operator's `date -s`, a VM restored), the
durations of that tick are false: +1 h makes every healthy run look an hour old, -1 h
makes a runaway look young. The monotonic clock cannot be stepped, so between two
readings the two deltas agree unless the clock jumped. The times the active runs carry
(started_at, last_seen_at...) were read off the old clock: `Jump.rebased` moves them onto
the new one, and the tick of the jump judges no duration at all. (A suspended host also shows as
a jump: the monotonic clock stops while suspended. Not judging durations for one tick
after a resume is right too.)
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import overload


# Smaller disagreements are not worth a tick without clock budgets: no budget is that fine,
# and a loaded host (or a clock read a moment late) disagrees by a second now and then.
MIN_JUMP_S = 2.0


@dataclass(frozen=True)
class Jump:
    clock_delta_s: float  # how far the store's clock moved between the two readings
    monotonic_delta_s: float  # how much time really passed
    at: dt.datetime  # the second reading (after the jump)
    before: dt.datetime  # the first reading (before it)

    @property
    def skew_s(self) -> float:
        """Positive: the clock jumped forward by about this much; negative: backwards."""
        return self.clock_delta_s - self.monotonic_delta_s

    def old_epoch(self, value: dt.datetime) -> bool:
        """`value` was read off the clock before the jump. Such times are at most `before`; the
        times read after it are at least the jump's instant on the new clock, which lies in
        [at - monotonic_delta_s, at]. Forward, the two sets never meet; backwards, a time in
        that window could be either and is left as it is (a run started about |skew| before
        the jump: long past its wall-clock budget, or a long job judged a little young)."""
        return value <= self.before and not (self.at - dt.timedelta(seconds=self.monotonic_delta_s) <= value
                                             <= self.at)

    @overload
    def rebased(self, value: dt.datetime) -> dt.datetime: ...
    @overload
    def rebased(self, value: None) -> None: ...
    @overload
    def rebased(self, value: dt.datetime | None) -> dt.datetime | None: ...

    def rebased(self, value: dt.datetime | None) -> dt.datetime | None:
        """`value` on the new clock: a time read before the jump moves with it (a run that
        started 10 s before a +1 h jump is 10 s old, not 3,610 s)."""
        if value is None or not self.old_epoch(value):
            return value
        return value + dt.timedelta(seconds=self.skew_s)

    def describe(self) -> str:
        return (f"the clock jumped {self.skew_s:+.0f} s: it moved {self.clock_delta_s:+.1f} s while "
                f"{self.monotonic_delta_s:.1f} s passed")


class JumpDetector:
    """Feed it (monotonic seconds, clock reading) once per tick; it answers the jump since the
    previous reading, or None. `tolerance_s` (one tick): smaller disagreements are the time
    between the two readings (a slow query) rather than a step of the clock."""

    def __init__(self, tolerance_s: float) -> None:
        if not tolerance_s > 0:
            raise ValueError(f"tolerance_s: expected > 0, got {tolerance_s!r}")
        self.tolerance_s = float(tolerance_s)
        self._last: tuple[float, dt.datetime] | None = None

    def observe(self, monotonic_s: float, clock: dt.datetime) -> Jump | None:
        last, self._last = self._last, (monotonic_s, clock)
        if last is None:
            return None
        jump = Jump((clock - last[1]).total_seconds(), monotonic_s - last[0], clock, last[1])
        return jump if abs(jump.skew_s) > self.tolerance_s else None
