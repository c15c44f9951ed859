"""What the Ticker remembers between ticks (TickState), and what lives for one tick (ThisTick).

The Ticker's memory was a dozen private fields that the pause, exec-tree and backstop
modules reached into; it is one type now, passed to them explicitly. Everything here is
a cache of something the store or the daemon's state file also says (an alert key is
unique, a stop is recorded once), so forgetting a run early costs a read, never a
second alert or a second signal. Pure: no store, no processes.
"""

from __future__ import annotations

import datetime as dt
from collections import Counter
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from watchdog.core.periods import PeriodState
    from watchdog.daemon.money.moneytick import MoneyTick
    from watchdog.daemon.trust.scan import NewEvent

# The pause and resume alert keys known to be queued: past this many, forgotten at once
# (each is re-checked against the store's unique alert key, so forgetting is only a read).
MAX_PAUSE_KEYS = 10_000


@dataclass
class TickState:
    """The Ticker's memory between ticks, keyed by run id."""

    acked: set[str] = field(default_factory=set)  # stopping runs whose stop this daemon recorded or acknowledged
    decided: set[str] = field(default_factory=set)  # runs whose stop this daemon decided (they may be signalled)
    rate_alarmed: dict[str, dt.datetime] = field(default_factory=dict)  # run id -> its last rate alarm
    pause_seen: set[str] = field(default_factory=set)  # pause alert keys known to be queued (store.pause)
    resume_seen: set[tuple[str, int]] = field(default_factory=set)  # (run id, resumes) whose resume is alerted
    backstopped: set[str] = field(default_factory=set)  # quarantined runs stopped or ended by the backstop
    redriven: set[str] = field(default_factory=set)  # redrive alert keys carried out (watchdog.daemon.stops.redrive)
    # runs whose row a writer held locked: run id -> ticks in a row (watchdog.daemon.tick.judging)
    locked: dict[str, int] = field(default_factory=dict)
    locked_tried: dict[str, int] = field(default_factory=dict)  # run id -> the number of its last try
    locked_tries: int = 0  # tries numbered, so the least recently tried locked run goes first
    # run id -> the (pid, transaction id) of each session seen holding its row at its last miss
    # (watchdog.daemon.tick.row_holders: the same transaction at two ticks in a row is ended)
    lockers: dict[str, frozenset[tuple[int, str]]] = field(default_factory=dict)
    # run id -> the logins of the sessions ended for holding its row, until its step is taken
    offenders: dict[str, frozenset[str]] = field(default_factory=dict)
    # the daemon's login may not end another login's session (no pg_signal_backend): said once
    end_refused_said: bool = False

    def holds_runs(self) -> bool:
        """Whether `forget` has anything to do (the ticker then builds the set of active ids)."""
        return bool(self.acked or self.decided or self.rate_alarmed or self.backstopped or self.locked
                    or len(self.pause_seen) > MAX_PAUSE_KEYS or len(self.resume_seen) > MAX_PAUSE_KEYS)

    def forget(self, active_ids: Collection[str]) -> None:
        """Forget the runs that are no longer active; bound the pause keys."""
        # Only what is held is looked up: a set of the 10,000 active ids is not built for it.
        self.acked = {r for r in self.acked if r in active_ids}
        self.decided = {r for r in self.decided if r in active_ids}
        self.backstopped = {r for r in self.backstopped if r in active_ids}
        for rid in [k for k in self.rate_alarmed if k not in active_ids]:
            del self.rate_alarmed[rid]
        for rid in [k for k in self.locked if k not in active_ids]:
            del self.locked[rid]
            self.locked_tried.pop(rid, None)
            self.lockers.pop(rid, None)
            self.offenders.pop(rid, None)
        if len(self.pause_seen) > MAX_PAUSE_KEYS or len(self.resume_seen) > MAX_PAUSE_KEYS:
            self.pause_seen.clear()
            self.resume_seen.clear()


@dataclass
class TickReport:
    at: dt.datetime
    active: int = 0
    stopping: int = 0
    new_events: int = 0
    stops: list[tuple[str, str]] = field(default_factory=list)  # (run id, reason)
    # Stops this daemon did not decide (a guard, a gateway, the CLI), heard this tick: (run id, reason).
    heard: list[tuple[str, str]] = field(default_factory=list)
    pauses: list[tuple[str, str]] = field(default_factory=list)  # (run id, reason): on_breach = "pause"
    paused: int = 0  # runs waiting for a human
    lost: list[str] = field(default_factory=list)
    alarms: list[str] = field(default_factory=list)
    events: list[NewEvent] = field(default_factory=list)  # the tool events folded this tick
    duration_s: float = 0.0
    priced_steps: int = 0  # steps the SDK could not price that the daemon priced this tick
    learned_prices: list[str] = field(default_factory=list)  # models added to the published price table
    unpriced: dict[str, int] = field(default_factory=dict)  # model -> tokens no table prices (first seen this tick)
    booked: int = 0  # ended runs booked into the spend ledger
    periods: list[PeriodState] = field(default_factory=list)  # every period budget's state (core.periods)
    leader: bool = True  # this daemon did the cluster duties this tick
    adopted: tuple[str, ...] = ()  # hosts without a live daemon whose runs it judged too
    quarantined: list[str | None] = field(default_factory=list)  # run ids (None: an event of no run) not judged
    locked: list[str] = field(default_factory=list)  # runs whose row a writer held locked: tried again next tick
    # (run id, login, pid) of each session the daemon ended this tick for holding a run's row locked
    ended_sessions: list[tuple[str, str, int]] = field(default_factory=list)
    full: bool = True  # this tick read every active run (False: only what changed, issue 25)
    looked: int = 0  # the runs the pre-filter looked at (all of them on a full tick)


@dataclass
class PeriodStop:
    """A running run this tick stopped for a spent period budget (named in that budget's alert)."""

    run_id: str
    reason: str
    scope: str  # the period budget's scope key


@dataclass
class ThisTick:
    """What one tick knows and only it: replaced by the next tick's (the Ticker keeps the last one,
    for its report), never read as memory across ticks."""

    now: dt.datetime
    rep: TickReport
    skip_clock: bool = False  # the clock just jumped: durations are not judged this tick
    judged: frozenset[str] | None = None  # the hosts whose runs this daemon judges (None: every host)
    live: set[int] | None = None  # the process table's pids (None: unknown, so no run is called lost)
    money: MoneyTick | None = None  # the money work, when this daemon leads
    sharing: Counter[tuple[str, int | None]] = field(default_factory=Counter)  # (host, pid) -> active runs on it
    period_stops: list[PeriodStop] = field(default_factory=list)
    lock_waits: int = 0  # the bounded lock waits that gave up this tick (watchdog.daemon.tick.judging)
