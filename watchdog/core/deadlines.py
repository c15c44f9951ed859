"""When a run that writes nothing next needs the tick: its deadlines (issue 25).

A run whose rows do not change can still come due: its wall clock runs out, it has been silent
too long, nobody answered its pause, its stop ladder's grace is over, a period budget's day
ends. The tick keeps each active run's next deadline in a due-queue (watchdog.daemon.tick.duequeue)
and evaluates a run only when it changed or a deadline came; these functions say when, from the
run's light row (watchdog.store.changes.RunChange, or anything with the same fields) and its
profile. They only say *when to look*: the policies still decide, on the whole row. So a
deadline may be early (one evaluation too many), never late.

The same rules as the judging code, not a second copy: the limits come from
`budgets.effective`, the crossing instant from the budget's own comparison (`Budget.at_limit`:
a clock budget trips when the measure is *over* its limit), the ladder's graces from the
daemon's config, the day from `periods.period_bounds`.

Pure: numbers in (epoch seconds), deadlines out.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Mapping
from enum import StrEnum
from typing import NamedTuple, Protocol

from watchdog.core import lifecycle as lc
from watchdog.core.budgets import BY_KEY, Budget, Budgets, effective
from watchdog.core.config import DaemonConfig
from watchdog.core.periods import DAY, period_bounds


class Why(StrEnum):
    """What a deadline is for."""

    WALL_CLOCK = "wall_clock"  # max_wall_s runs out
    SILENCE = "silence"  # heartbeat_timeout_s without a record
    APPROVAL_TIMEOUT = "approval_timeout"  # a paused run nobody answered
    LADDER_STEP = "ladder_step"  # the stop ladder's next step may be taken
    PERIOD_BOUNDARY = "period_boundary"  # a period budget's day (or month) ends


class Deadline(NamedTuple):
    at_s: float  # epoch seconds; 0.0 = due now (a row without the time the deadline runs from)
    why: Why


class DeadlineRow(Protocol):
    """What the deadlines read of a run (watchdog.store.changes.RunChange has it)."""

    @property
    def status(self) -> str: ...
    @property
    def started_s(self) -> float | None: ...
    @property
    def seen_s(self) -> float | None: ...
    @property
    def stop_requested_s(self) -> float | None: ...
    @property
    def signalled_s(self) -> float | None: ...
    @property
    def paused_s(self) -> float | None: ...
    @property
    def signal_stage(self) -> str | None: ...
    @property
    def asked(self) -> Mapping[str, float]: ...


NOW = 0.0  # a deadline at the epoch: due at once
WALL = BY_KEY["max_wall_s"]
SILENT = BY_KEY["heartbeat_timeout_s"]


def crossing(budget: Budget, from_s: float, limit: float) -> float:
    """The first instant at which `budget`, measured since `from_s`, trips: its limit reached
    for an at-limit budget, else the first float past it (`Budget.over`: value > limit)."""
    t = from_s + limit
    return t if budget.at_limit else math.nextafter(t, math.inf)


def deadlines(row: DeadlineRow, prof: Budgets, daemon: DaemonConfig, now_s: float, *,
              first_seen_s: float | None = None, raised: bool = False, pause_since_s: float | None = None,
              period_end_s: float | None = None) -> list[Deadline]:
    """Every deadline of the run, soonest first (none for an ended run).

    `prof`: the profile that judges it (the [defaults] one when its owner may not use its own);
    `raised`: a sealed resume raised its budgets (watchdog.daemon.trust.trust); `first_seen_s`: when the
    daemon first saw it (its wall clock runs from then at the latest); `pause_since_s`: when the
    daemon paused it or confirmed the pause (its state file), else the row's paused_at counts;
    `period_end_s`: the end of the current period-budget day (`next_period_boundary`), when the
    run's agent or labels have a period budget. `now_s`: for the ladder's stages that have no
    deadline of their own (waiting for a process to go): looked at again one tick later.
    """
    out: list[Deadline] = []
    status = row.status
    if status == lc.STOPPING:
        out.append(Deadline(_ladder_step(row, daemon, now_s), Why.LADDER_STEP))
        return out
    if status not in (lc.RUNNING, lc.PAUSED):
        return out
    b = effective(prof, row.asked, raised=raised)
    seen = row.seen_s
    # Silence stops a paused run too (it never pauses: watchdog.core.policies.stops_while_paused).
    out.append(Deadline(NOW if seen is None else crossing(SILENT, seen, b.heartbeat_timeout_s), Why.SILENCE))
    if status == lc.PAUSED:
        since = pause_since_s if pause_since_s is not None else row.paused_s
        # The approval timeout trips when the wait reaches it (watchdog.daemon.tick.judging: waited >= timeout).
        out.append(Deadline(NOW if since is None else since + b.approval_timeout_s, Why.APPROVAL_TIMEOUT))
    else:
        starts = [s for s in (row.started_s, first_seen_s) if s is not None]
        out.append(Deadline(NOW if not starts else crossing(WALL, min(starts), b.max_wall_s), Why.WALL_CLOCK))
        if period_end_s is not None:
            out.append(Deadline(period_end_s, Why.PERIOD_BOUNDARY))
    out.sort()
    return out


def next_deadline(row: DeadlineRow, prof: Budgets, daemon: DaemonConfig, now_s: float, *,
                  first_seen_s: float | None = None, raised: bool = False, pause_since_s: float | None = None,
                  period_end_s: float | None = None) -> Deadline | None:
    """The soonest of `deadlines`, or None for an ended run."""
    found = deadlines(row, prof, daemon, now_s, first_seen_s=first_seen_s, raised=raised,
                      pause_since_s=pause_since_s, period_end_s=period_end_s)
    return found[0] if found else None


def _ladder_step(row: DeadlineRow, daemon: DaemonConfig, now_s: float) -> float:
    """When the stop ladder (watchdog.daemon.stops.ladder) may act next on a stopping run: the
    cooperative stop's grace after the request, SIGTERM's grace after the signal; otherwise
    (SIGKILL sent, or waiting for a process it will not signal) one tick later, unless the
    process's end wakes the tick first (watchdog.daemon.stops.liveness)."""
    stage = row.signal_stage
    if stage is None:
        at = row.stop_requested_s
        return NOW if at is None else at + daemon.cancel_grace_s
    if stage == lc.Stage.TERM:
        at = row.signalled_s
        return NOW if at is None else at + daemon.term_grace_s
    return now_s + daemon.tick_s


def next_period_boundary(now: dt.datetime, tz: dt.tzinfo) -> float:
    """The end of the period-budget day containing `now` in `tz`, epoch seconds: a month ends at
    the end of one of its days, so this is the next instant any period budget starts over."""
    return period_bounds(DAY, now, tz)[1].timestamp()
