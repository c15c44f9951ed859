"""The seam between the judge and the enforcer: the ladder's decision as a typed command list.

The judge (here, pure: a run row, the daemon's graces and the clock passed in; no store, no
process table, no socket) says which step of the stop ladder a `stopping` run is due for —
the cooperative stop left as it is (`cancel`), SIGTERM, SIGKILL, SIGKILL with cgroup.kill,
or a look whether its processes are gone (`confirm`) — as frozen `Command`s. The enforcer of
the run's host (watchdog.daemon.stops.enforcer) attests the processes and carries each command
out at most once, keyed by (run_id, action_no). Today's daemon runs both in one process: the
tick's judge step (watchdog.daemon.tick.stopping_runs) makes the list and the Ticker's own
Enforcer executes it; a judge elsewhere would hand the same list to each host's enforcer.

A command names the run's target identity as the judge read it off the row: that is what the
judge decided about, never an authority to signal. The enforcer signals only the identity this
host's daemon attested (sealed), and drops a command whose target no longer matches its row.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from enum import StrEnum

from watchdog.core import lifecycle as lc
from watchdog.core.config import DaemonConfig
from watchdog.core.rowviews import RunView

KILL_CONFIRM_S = 10.0  # a process still there this long after SIGKILL is stuck (D state): say so


class Kind(StrEnum):
    CANCEL = "cancel"  # a cooperative run still running after the cancel grace: never signalled, said so
    SIGTERM = "sigterm"  # the first signal (after the cancel grace), or again on an operator's redrive
    SIGKILL = "sigkill"  # after the term grace, to what the SIGTERM reached and the tree
    CGROUP_KILL = "cgroup_kill"  # SIGKILL, then cgroup.kill of the run's own cgroup (kill_mode cgroup)
    CONFIRM = "confirm"  # no signal: end the run if its processes are gone (after SIGKILL: or give up)


# The number of the ladder step that leaves each stage. STAGE_MOVES is acyclic (no stage is
# reached twice), so each stage is left at most once per run and (run_id, action_no) names one
# step of one run: the key the enforcer executes at most once (watchdog.daemon.stops.enforcer).
ACTION_NO: dict[str | None, int] = {None: 1, lc.Stage.REFUSED: 2, lc.Stage.TERM: 3, lc.Stage.KILL: 4}


@dataclass(frozen=True, slots=True)
class Target:
    """Whom the judge decided about, as the row named it (the enforcer attests it again)."""

    host: str
    pid: int | None
    pid_create_time: float | None
    kill_mode: str

    @classmethod
    def of(cls, row: RunView) -> Target:
        return cls(row.host, row.pid, row.pid_create_time, row.kill_mode)


@dataclass(frozen=True, slots=True)
class Command:
    """One step of one run's ladder, as the judge decided it at `decided_at`."""

    run_id: str
    action_no: int
    kind: Kind
    from_stage: str | None  # the stage the step leaves: the enforcer acts only while the run is there
    target: Target
    decided_at: dt.datetime
    redriven: bool = False  # the operator's sealed `kill` drove a refused stop again
    give_up: bool = False  # CONFIRM after SIGKILL: past KILL_CONFIRM_S, a survivor fails the stop

    @property
    def key(self) -> tuple[str, int]:
        return self.run_id, self.action_no

    @property
    def signals(self) -> bool:
        return self.kind in (Kind.SIGTERM, Kind.SIGKILL, Kind.CGROUP_KILL)


def _since(t: dt.datetime | None, now: dt.datetime) -> float:
    return (now - t).total_seconds() if t else 0.0


def due(row: RunView, now: dt.datetime, daemon: DaemonConfig, host: str) -> bool:
    """Whether the ladder could do anything for this stopping run now (no store, no OS).
    judge() starts by asking this, so the two cannot disagree."""
    if row.signal_stage not in lc.ACTING_STAGES:  # done, or waiting for a process it will not signal
        return False
    if _since(row.stop_requested_at, now) < daemon.cancel_grace_s:
        return False
    return row.kill_mode == lc.COOPERATIVE or row.host == host


def _kind(row: RunView, stage: str | None, now: dt.datetime, daemon: DaemonConfig) -> Kind | None:
    if row.kill_mode == lc.COOPERATIVE:
        return Kind.CANCEL if stage is None else None  # a shared process is never signalled
    if stage in (None, lc.Stage.REFUSED):
        return Kind.SIGTERM
    if stage == lc.Stage.TERM and _since(row.signalled_at, now) >= daemon.term_grace_s:
        return Kind.CGROUP_KILL if row.kill_mode == lc.CGROUP else Kind.SIGKILL
    return Kind.CONFIRM


def judge(row: RunView, now: dt.datetime, daemon: DaemonConfig, host: str, *,
          redriven: bool = False) -> tuple[Command, ...]:
    """The commands due for one stopping run at `now`, for the enforcer of `host`; () when none.
    `redriven`: a sealed redrive of a refused stop is pending (watchdog.daemon.stops.redrive)."""
    redriven = redriven and row.signal_stage == lc.Stage.REFUSED and row.host == host
    if not (redriven or due(row, now, daemon, host)):
        return ()
    stage = row.signal_stage
    kind = _kind(row, stage, now, daemon)
    if kind is None:
        return ()
    give_up = stage == lc.Stage.KILL and _since(row.signalled_at, now) >= KILL_CONFIRM_S
    return (Command(row.id, ACTION_NO[stage], kind, stage, Target.of(row), now, redriven=redriven, give_up=give_up),)
