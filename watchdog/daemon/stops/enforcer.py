"""The enforcer: this host's hand for the judge's commands (watchdog.daemon.stops.commands).

It attests the processes (the leader this host's daemon sealed, its tree, its cgroup), then
carries each command out through the Killer (pidfd + create time; every killer rule holds),
and writes the step (watchdog.daemon.stops.steps). It decides nothing the judge did not: a
command whose run moved on, whose target no longer matches its row, or that names another
host, is dropped (the target is read again under the row's lock: store.ladder.stage_now).

Exactly once, keyed by (run_id, action_no). A command's action_no names the step that leaves
its `from_stage`, and that stage is the key's durable record, in the two places it already
lives: the run row's `signal_stage` and the daemon's own state file (watchdog.store.memory,
`stages`, read through watchdog.daemon.trust.ownstage). A command runs only while both say
the run is still at its `from_stage`; the row is read under its lock (FOR UPDATE; SQLite's
writers hold the write lock from BEGIN IMMEDIATE), so a second enforcer on the same store waits
for the first one's commit and then finds the stage moved. That wait is bounded
(engine.bound_lock_waits): a run's own writer may hold its row locked, and then the step is not
taken this tick (watchdog.daemon.tick.judging) — never from the state file alone, which would
give up that serialisation (docs/explanation/security.md, "A run that holds its own row locked"). Why no store writer can forge the
key: the state file is the daemon's (mode 0600 in its state directory; no store writer has it),
so a run's writer that puts its row's stage back (`term` -> NULL, to be signalled again) finds
its step still taken there; the tick also writes the daemon's stage back to the row
(ownstage.restore). The state file is one per state directory and store, beside the host lock
(an flock in the same directory: one daemon per directory holds a store), so a second enforcer
with an empty file on a forged row takes the operator starting a second daemon with another
state_dir; another host's enforcer signals nothing here (the killer refuses another host's
identity). Two enforcers at once serialise on the row lock whatever their files. No new row is
written for the key: a row any store writer can insert is no proof of what the daemon did. The
state file is written the moment the killer returns, before the store: a crash after it sends
nothing twice (the tick writes the stage back to the row); only one between the kernel taking
the signal and that local write could cost one more signal, to the same attested process (pidfd
+ create time), as a lost state file would (ownstage).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from watchdog.core import lifecycle as lc
from watchdog.core.interventions import Action
from watchdog.core.outcomes import Outcome, Say, AlertKind
from watchdog.core.procid import GONE_REASONS, ProcessIdentity
from watchdog.core.rowviews import RunView
from watchdog.daemon.stops.attest import verified_cgroup, verified_leader
from watchdog.daemon.stops.commands import Command, Kind, Target
from watchdog.daemon.stops.killer import PERMISSION_DENIED, Killer, SignalOutcome
from watchdog.daemon.stops.redrive import hold_denied
from watchdog.daemon.stops.runtree import directory, remaining, remove_empty
from watchdog.daemon.stops.steps import (NOT_ATTESTED, Said, fail, finish, hold_unconfirmed, sealed_detail,
                                         set_stage, signalled_targets, since)
from watchdog.daemon.stops.stopping import SPANS_UNPROVEN
from watchdog.daemon.trust import ownstage
from watchdog.daemon.trust.authentic import hold_not_own
from watchdog.store import ladder as store
from watchdog.store.alerts import Audit, announce, record
from watchdog.store.engine import Connection
from watchdog.store.memory import Memory

# The processes the daemon attributes to an exec'd run's attested root (runtree.TreeMemory).
Remembered = Callable[[ProcessIdentity], Iterable[ProcessIdentity]]


@dataclass(frozen=True)
class Checks:
    """What the enforcer asks before a first signal, and what the alerts may say of the run."""

    said: Said
    cancel_grace_s: float
    term_grace_s: float
    sharing: int = 0  # the other runs sharing the process (a cooperative run's alert)
    confirmed: Callable[[], bool] | None = None  # is the stop the daemon's own (or do its budgets agree)?
    own_evidence: Callable[[], bool | str] | None = None  # may a signal rest on the run's own evidence?
    remembered: Remembered | None = None


class Enforcer:
    """One per host: carries the judge's commands out, each at most once. The daemon's Ticker
    holds one, over its killer and its state file. It holds no state of its own (the key lives
    on the row and in `memory`): a restarted enforcer is a new one."""

    def __init__(self, killer: Killer, memory: Memory | None = None) -> None:
        self.killer = killer
        self.memory = memory

    def pending(self, conn: Connection, command: Command) -> bool:
        """Whether the step `command` takes is still to take: the run is stopping at its
        `from_stage` by its row (read under the row's lock) and by the daemon's own record, and
        the row's target (host, pid, create time, kill mode), read again under that lock, is still
        the one the judge decided about: a writer that re-registered its process between the
        judge's read and this step gets the step dropped (the next tick judges the new row)."""
        now = store.stage_now(conn, command.run_id)
        if now is None or (now.status, now.signal_stage) != (lc.STOPPING, command.from_stage):
            return False
        if Target(now.host, now.pid, now.pid_create_time, now.kill_mode) != command.target:
            return False
        return self.memory is None or ownstage.own_stage(self.memory, command.run_id)[0] == command.from_stage

    def carry_out(self, conn: Connection, commands: Iterable[Command], row: RunView, checks: Checks) -> int:
        """The judge's commands for one run, in order, in the caller's transaction: how many were
        carried out (the others were dropped: not this host's, stale, or already carried out)."""
        return sum(self.execute(conn, command, row, checks) for command in commands)

    def execute(self, conn: Connection, command: Command, row: RunView, checks: Checks) -> bool:
        """Carry one command out in the caller's transaction; False when it was dropped (not this
        host's, stale, or already carried out)."""
        local = command.kind == Kind.CANCEL or command.target.host == self.killer.host
        if not (local and command.run_id == row.id and command.target == Target.of(row)):
            return False
        if not self.pending(conn, command):
            return False
        if command.kind == Kind.CANCEL:
            _cancel(conn, row, checks)
        else:
            self._signal_step(conn, command, row, checks)
        if self.memory is not None:
            ownstage.remember(conn, self.memory, row, command.from_stage)
        return True

    def _taken(self, run_id: str, stage: str, now: dt.datetime) -> None:
        """The step is taken: in the daemon's state file at once, before any store write, so that
        a crash from here on sends no second signal (the tick puts the stage back on the row).
        Later than every stage remembered before (ownstage reads the newest as the run's)."""
        if self.memory is not None:
            before = self.memory.stages(run_id).values()
            self.memory.reached(run_id, stage, max([now.timestamp(), *(at_s + 1e-6 for at_s in before)]))

    def _signal_step(self, conn: Connection, command: Command, row: RunView, checks: Checks) -> None:
        s, first = checks.said, command.kind == Kind.SIGTERM
        start = command.from_stage if first else None  # the stage the first step moves from
        if row.pid is None or row.pid_create_time is None:
            if first:
                fail(conn, row, start, lc.Stage.REFUSED, Action.SIGNAL_REFUSED,
                     "not signalled: the run registered no process identity", s)
            return
        # The identity the daemon attested, never the row's own word; the row only says which run.
        leader, why = verified_leader(conn, row, s.sealer)
        if leader is None:
            if first:
                fail(conn, row, start, lc.Stage.REFUSED, Action.SIGNAL_REFUSED, f"{NOT_ATTESTED} ({why})", s)
            else:  # signalled once, and its attestation is not valid any more: changed since
                fail(conn, row, command.from_stage, lc.Stage.FAILED, Action.SIGNAL_REFUSED,
                     f"{NOT_ATTESTED} any more ({why})", s)
            return
        assert s.sealer is not None  # verified_leader names no one without the daemon's key
        cgroup_dir, orphans = self._exec_tree(conn, row, leader, checks)
        if first:
            self._first_signal(conn, row, leader, cgroup_dir, orphans, checks, start)
        else:
            self._after_sigterm(conn, command, row, leader, cgroup_dir, orphans, checks)

    def _exec_tree(self, conn: Connection, row: RunView, leader: ProcessIdentity,
                   checks: Checks) -> tuple[str | None, list[ProcessIdentity]]:
        """(the run's cgroup directory, the live processes of its tree besides what is enumerated
        from the leader) for an exec'd run: from the verified attestation's cgroup and the daemon's
        own memory of the attested root's descendants, never from a row."""
        if row.kill_mode not in (lc.TREE, lc.CGROUP):
            return None, []
        cgroup_dir = (directory(row.id, verified_cgroup(conn, row, checks.said.sealer))
                      if row.kill_mode == lc.CGROUP else None)
        found = list(checks.remembered(leader)) if checks.remembered is not None else []
        return cgroup_dir, remaining(self.killer, found, cgroup_dir)

    def _first_signal(self, conn: Connection, row: RunView, leader: ProcessIdentity, cgroup_dir: str | None,
                      orphans: list[ProcessIdentity], checks: Checks, start: str | None) -> None:
        """SIGTERM, once the process is checked and the stop confirmed the daemon's own; or why
        there is none (gone, refused, unconfirmed, not the run's own evidence)."""
        s = checks.said
        refusal = self.killer.refusal(leader)
        if refusal in GONE_REASONS and orphans:
            refusal = None  # exec is gone, its tree is not: the daemon takes it down itself
        if refusal is not None:
            _not_sent(conn, row, refusal, s, start)
            return
        if _held(conn, row, checks):
            return
        out = self.killer.terminate(leader, row.kill_mode, extra=orphans, cgroup_dir=cgroup_dir)
        if out.refused in GONE_REASONS and out.targets:
            out = dataclasses.replace(out, refused=None)  # exec was gone; its tree got the signal
        if out.refused == PERMISSION_DENIED and not out.targets and start is None:
            hold_denied(conn, row, **_kw(s))  # the daemon lacks CAP_KILL: not final, retried each tick
        elif out.refused is not None:  # it exited between the check and the signal, or was refused
            _not_sent(conn, row, out.refused, s, start)
        else:
            self._taken(row.id, lc.Stage.TERM, s.now)
            _terminated(conn, row, out, s, start)

    def _after_sigterm(self, conn: Connection, command: Command, row: RunView, leader: ProcessIdentity,
                       cgroup_dir: str | None, orphans: list[ProcessIdentity], checks: Checks) -> None:
        """At `term`: end the run once its tree is gone, else SIGKILL when the judge says the term
        grace is over; at `kill`: end it once gone, else give up past KILL_CONFIRM_S."""
        s = checks.said
        assert s.sealer is not None
        targets = signalled_targets(conn, row, s, s.sealer) or [leader]
        alive = remaining(self.killer, [*targets, *orphans], cgroup_dir)
        waited_s = since(row.signalled_at, s.now)
        if not alive and cgroup_dir and not self.killer.alive([leader]):
            remove_empty(cgroup_dir)  # exec, which removes its cgroup, is gone: the daemon does
        stage = command.from_stage
        if not alive:
            said = (f"SIGTERM after {checks.cancel_grace_s:g} s; exited within {waited_s:.1f} s"
                    if stage == lc.Stage.TERM else
                    f"ignored SIGTERM for {checks.term_grace_s:g} s; SIGKILL; gone within {waited_s:.1f} s")
            finish(conn, row, stage, said, s, escalated=True)
        elif command.kind in (Kind.SIGKILL, Kind.CGROUP_KILL):
            out = self.killer.kill(leader, row.kill_mode, [*targets, *orphans], cgroup_dir=cgroup_dir)
            self._taken(row.id, lc.Stage.KILL, s.now)
            _killed(conn, row, out, s)
        elif command.give_up and stage == lc.Stage.KILL:
            pids = ", ".join(str(t.pid) for t in alive)
            fail(conn, row, lc.Stage.KILL, lc.Stage.FAILED, Action.STOP_FAILED,
                 f"still alive {waited_s:.0f} s after SIGKILL (pids {pids}; uninterruptible?)", s)


def _held(conn: Connection, row: RunView, checks: Checks) -> bool:
    """Held before a first signal (recorded and alerted once): the stop is not the daemon's own,
    or the signal would rest on evidence that is not the run's own."""
    s = checks.said
    if checks.confirmed is not None and not checks.confirmed():
        hold_unconfirmed(conn, row, **_kw(s))
        return True
    if checks.own_evidence is not None and (own := checks.own_evidence()) is not True:
        hold_not_own(conn, row, what=own if isinstance(own, str) else "", **_kw(s))  # what was refused
        return True
    return False


def _kw(s: Said) -> dict[str, Any]:
    return dict(now=s.now, by=s.by, facts=s.facts, budgets=s.budgets, sealer=s.sealer)


def _not_sent(conn: Connection, row: RunView, why: str, s: Said, start: str | None) -> None:
    if why in GONE_REASONS:
        finish(conn, row, start, f"process exited after the cooperative stop ({why})", s, escalated=False)
    else:
        fail(conn, row, start, lc.Stage.REFUSED, Action.SIGNAL_REFUSED, f"not signalled: {why}", s)


def _terminated(conn: Connection, row: RunView, out: SignalOutcome, s: Said, start: str | None) -> None:
    if set_stage(conn, row, start, lc.Stage.TERM, s.now):
        assert s.sealer is not None
        detail = sealed_detail(s.sealer, row.id, out.targets, skipped=list(out.skipped))
        record(conn, at=s.now, action=Action.SIGTERM, by=s.by, run_id=row.id, reason=row.stop_reason,
               detail=detail, outcome=out.summary())


def _killed(conn: Connection, row: RunView, out: SignalOutcome, s: Said) -> None:
    if set_stage(conn, row, lc.Stage.TERM, lc.Stage.KILL, s.now):
        assert s.sealer is not None
        record(conn, at=s.now, action=Action.SIGKILL, by=s.by, run_id=row.id, reason=row.stop_reason,
               detail=sealed_detail(s.sealer, row.id, out.targets), outcome=out.summary())


def _cancel(conn: Connection, row: RunView, checks: Checks) -> None:
    """A cooperative run still running after the cancel grace: it shares its process (or was seen
    only through spans whose sender the kernel did not confirm), so it is never signalled."""
    s = checks.said
    if not set_stage(conn, row, None, lc.Stage.NOT_SIGNALLED, s.now):
        return
    if getattr(row, "source", None) == lc.Source.OTLP:
        announce(conn, Outcome.of(Say.ESCALATION, AlertKind.ESCALATE.key(row.id), row.id, f=s.facts, b=s.budgets,
                                  reason=row.stop_reason, outcome=SPANS_UNPROVEN, failed=True),
                 now=s.now, sealer=s.sealer,
                 audit=Audit(Action.NOT_SIGNALLED, s.by, reason=row.stop_reason, outcome=SPANS_UNPROVEN))
        return
    outcome = (f"did not stop {checks.cancel_grace_s:g} s after the cooperative stop; shares its process with "
               f"{checks.sharing} other runs")
    announce(conn, Outcome.of(Say.COOPERATIVE, AlertKind.ESCALATE.key(row.id), row.id, f=s.facts, b=s.budgets,
                              reason=row.stop_reason, grace_s=checks.cancel_grace_s, sharing=checks.sharing),
             now=s.now, sealer=s.sealer, audit=Audit(Action.NOT_SIGNALLED, s.by, reason=row.stop_reason,
                                                     outcome=outcome))
