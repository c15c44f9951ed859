"""The stop ladder for runs in `stopping`: cooperative stop → SIGTERM → SIGKILL.

Its state lives on the run row (`signal_stage`, `signalled_at`) and in the
interventions (the SIGTERM row keeps the identities signalled, sealed), so a
daemon restarted at any moment continues exactly where the last one was, once.
The killer decides nothing: this module decides, the killer checks and sends.

Whom it may signal is never read from a writable row on its word: the leader is
the identity this host's daemon attested (`attest.verified_leader`, MAC
checked), the rest are what the killer enumerates from that leader, plus the
SIGTERM's targets only when their seal verifies. A run without a valid
attestation is stopped cooperatively and alerted, never signalled.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from watchdog.core.rowviews import RunView
from watchdog.core.alert_kinds import AlertKind
from watchdog.core.interventions import Action
from watchdog.core import lifecycle as lc
from watchdog.core.seal import Sealer
from watchdog.daemon.stops.stopping import SPANS_UNPROVEN
from watchdog.core.outcomes import Outcome, Say
from watchdog.store.announce import Audit, announce
from watchdog.store.interventions import record
from watchdog.core.budgets import Budgets
from watchdog.core.config import DaemonConfig
from watchdog.daemon.stops.attest import verified_cgroup, verified_leader
from watchdog.daemon.trust.authentic import hold_not_own
from watchdog.core.procid import GONE_REASONS, ProcessIdentity
from watchdog.daemon.stops.killer import PERMISSION_DENIED, Killer
from watchdog.daemon.stops.redrive import hold_denied
from watchdog.daemon.stops.runtree import directory, remaining, remove_empty
from watchdog.core.messages import RunFacts
from watchdog.store import ladder as store
from watchdog.store.engine import Connection

NOT_ATTESTED = "not signalled: identity not attested"

# The processes the daemon attributes to an exec'd run's attested root (runtree.TreeMemory).
Remembered = Callable[[ProcessIdentity], Iterable[ProcessIdentity]]

KILL_CONFIRM_S = 10.0  # a process still there this long after SIGKILL is stuck (D state): say so


def _since(t: dt.datetime | None, now: dt.datetime) -> float:
    return (now - t).total_seconds() if t else 0.0


def _set_stage(conn: Connection, row: RunView, expected: str | None, stage: str, now: dt.datetime) -> bool:
    return store.set_stage(conn, row.id, expected, stage, signalled_at=now)


def _finish(conn: Connection, row: RunView, stage_from: str | None, outcome: str, now: dt.datetime, by: str, facts: RunFacts,
            budgets: Budgets, escalated: bool, sealer: Sealer | None = None) -> None:
    if not store.finish(conn, row.id, stage_from, now):
        return
    audit = Audit(Action.ENDED, by, reason=row.stop_reason, outcome=outcome)
    if not escalated:  # one more alert only when the ladder went past the cooperative stop
        record(conn, at=now, action=audit.action, by=by, run_id=row.id, reason=audit.reason, outcome=outcome)
        return
    announce(conn, _escalation(row, facts, budgets, outcome, failed=False), now=now, sealer=sealer, audit=audit)


def _escalation(row: RunView, facts: RunFacts, budgets: Budgets, outcome: str, *, failed: bool,
                key: str | None = None) -> Outcome:
    return Outcome.of(Say.ESCALATION, key or AlertKind.ESCALATE.key(row.id), row.id, f=facts, b=budgets,
                      reason=row.stop_reason, outcome=outcome, failed=failed)


# Stages where the ladder has nothing more to send but the run is still `stopping`:
# the tick ends such a run once its process is gone, so it never stays active forever.
WAITING_STAGES = lc.WAITING_STAGES
_EXITED: dict[str | None, str] = {  # by signal_stage (a Stage is a str)
    None: "process exited after the cooperative stop",
    lc.Stage.REFUSED: "process gone; it was never signalled (the signal was refused)",
    lc.Stage.NOT_SIGNALLED: "process gone; it was never signalled (shared process)",
    lc.Stage.FAILED: "process gone at last after SIGKILL",
}


def exited(conn: Connection, row: RunView, *, now: dt.datetime, by: str, facts: RunFacts, budgets: Budgets,
           sealer: Sealer | None = None) -> None:
    """The process ended without ending its run (after the cooperative stop, or after a
    refused / impossible / failed signal): the run is killed."""
    _finish(conn, row, row.signal_stage, _EXITED[row.signal_stage], now, by, facts, budgets, escalated=False,
            sealer=sealer)


UNCONFIRMED = "not signalled: the stop was requested in the store and the daemon's own budgets do not confirm it"


def hold_unconfirmed(conn: Connection, row: RunView, *, now: dt.datetime, by: str, facts: RunFacts, budgets: Budgets,
                     sealer: Sealer | None = None) -> None:
    """A stop someone wrote into the store (a guard, the CLI, any store writer) that the
    daemon's own budgets do not confirm: no signal, so a row cannot lend anyone the daemon's
    CAP_KILL over another run. The stage stays where it is: the ladder asks again each tick,
    and signals once the daemon's own policies agree (a run that swallowed its stop goes
    silent and trips heartbeat_timeout). Recorded and alerted once."""
    announce(conn, _escalation(row, facts, budgets, UNCONFIRMED, failed=True, key=AlertKind.UNCONFIRMED.key(row.id)),
             now=now, sealer=sealer, once=True,
             audit=Audit(Action.SIGNAL_HELD, by, reason=row.stop_reason, outcome=UNCONFIRMED))


def _fail(conn: Connection, row: RunView, stage_from: str | None, stage_to: str, action: str, outcome: str, now: dt.datetime,
          by: str, facts: RunFacts, budgets: Budgets, sealer: Sealer | None = None) -> None:
    # Refused again on a redrive (issue 36): the stage stays, the refusal is recorded.
    if stage_from != stage_to and not _set_stage(conn, row, stage_from, stage_to, now):
        return
    announce(conn, _escalation(row, facts, budgets, outcome, failed=True), now=now, sealer=sealer,
             audit=Audit(action, by, reason=row.stop_reason, outcome=outcome))


def _sealable(targets: Iterable[ProcessIdentity]) -> list[tuple[str, int, float, int]]:
    return [(t.host, t.pid, t.create_time, -1 if t.uid is None else t.uid) for t in targets]


def _sealed_detail(sealer: Sealer, run_id: str, targets: Sequence[ProcessIdentity], **extra: Any) -> dict[str, Any]:
    return {"targets": [t.to_json() for t in targets], **extra, "mac": sealer.targets(run_id, _sealable(targets))}


def _parse_targets(detail: Any) -> tuple[list[ProcessIdentity], object] | None:
    try:
        d = json.loads(detail)
        return [ProcessIdentity.from_json(t) for t in d["targets"]], d.get("mac")
    except (TypeError, ValueError, KeyError, AttributeError):
        return None


def _signalled_targets(conn: Connection, row: RunView, *, sealer: Sealer, now: dt.datetime, by: str, facts: RunFacts,
                       budgets: Budgets) -> list[ProcessIdentity]:
    """What the SIGTERM reached, from the newest `sigterm` row whose seal verifies.

    Rows that do not verify (inserted by anyone who can write the store, to name
    victims for the SIGKILL) are ignored, and reported once per run."""
    found: list[ProcessIdentity] = []
    forged = 0
    for detail in store.sigterm_details(conn, row.id):
        parsed = _parse_targets(detail)
        if parsed is not None:
            targets, mac = parsed
            if sealer.targets_ok(mac, row.id, _sealable(targets)):
                found = targets
                break
        forged += 1
    if forged:
        _report_forged(conn, row, "sigterm", f"{forged} sigterm intervention row{'s' if forged != 1 else ''} whose "
                       "seal does not verify (not written by this daemon): their targets were ignored",
                       now=now, by=by, facts=facts, budgets=budgets, sealer=sealer)
    return found


def _report_forged(conn: Connection, row: RunView, kind: str, what: str, *, now: dt.datetime, by: str, facts: RunFacts,
                   budgets: Budgets, sealer: Sealer | None) -> None:
    """One intervention and one alert per run and kind of forgery, however often it is seen."""
    announce(conn, Outcome.of(Say.FORGED, AlertKind.FORGED.key(row.id, kind), row.id, f=facts, b=budgets, what=what),
             now=now, sealer=sealer, once=True,
             audit=Audit(Action.FORGED_ROW, by, reason=row.stop_reason, outcome=what[:255]))


def _exec_tree(conn: Connection, row: RunView, leader: ProcessIdentity, killer: Killer, sealer: Sealer | None,
               remembered: Remembered | None) -> tuple[str | None, list[ProcessIdentity]]:
    """(the run's cgroup directory, the live processes of its tree besides what is enumerated
    from the leader) for an exec'd run: from the verified attestation's cgroup and the daemon's
    own memory of the attested root's descendants, never from a row."""
    if row.kill_mode not in (lc.TREE, lc.CGROUP):
        return None, []
    cgroup_dir = directory(row.id, verified_cgroup(conn, row, sealer)) if row.kill_mode == lc.CGROUP else None
    found = list(remembered(leader)) if remembered is not None else []
    return cgroup_dir, remaining(killer, found, cgroup_dir)


def due(row: RunView, now: dt.datetime, daemon: DaemonConfig, host: str) -> bool:
    """Whether advance() could do anything for this stopping run now (pure: no store, no OS).
    advance() starts by asking this, so the two cannot disagree."""
    if row.signal_stage not in lc.ACTING_STAGES:  # done, or waiting for a process it will not signal
        return False
    if _since(row.stop_requested_at, now) < daemon.cancel_grace_s:
        return False
    return row.kill_mode == lc.COOPERATIVE or row.host == host


def advance(conn: Connection, row: RunView, *, killer: Killer, daemon: DaemonConfig, budgets: Budgets, facts: RunFacts,
            now: dt.datetime, by: str, sharing: int, sealer: Sealer | None = None,
            confirmed: Callable[[], bool] | None = None, remembered: Remembered | None = None,
            own_evidence: Callable[[], bool | str] | None = None, redriven: bool = False) -> None:
    """Take the next step of the ladder for one stopping run, if its time has come.
    `remembered(leader)`: the processes the daemon attributes to an exec'd run's attested root
    (watchdog.daemon.stops.runtree.TreeMemory), which outlive exec's death.
    `own_evidence()` (SQLite: watchdog.daemon.trust.authentic; PostgreSQL: watchdog.daemon.trust.owned): may
    the first signal rest on the run's own evidence (True; else False or what was refused)? If
    not, the run stays stopped cooperatively, alerted as such.
    `redriven`: a refused run the operator's sealed `kill` drove again (watchdog.daemon.stops.redrive):
    the first step is taken again from `refused`."""
    redriven = redriven and row.signal_stage == lc.Stage.REFUSED and row.host == killer.host
    if not (redriven or due(row, now, daemon, killer.host)):
        return
    stage = row.signal_stage
    start = stage if redriven else None  # the stage the first step moves from
    grace = f"{daemon.cancel_grace_s:g} s"
    common: dict[str, Any] = dict(now=now, by=by, facts=facts, budgets=budgets, sealer=sealer)

    if row.kill_mode == lc.COOPERATIVE and getattr(row, "source", None) == lc.Source.OTLP:
        # Seen only through spans, from a sender the kernel did not confirm: never signalled.
        if _set_stage(conn, row, None, lc.Stage.NOT_SIGNALLED, now):
            announce(conn, _escalation(row, facts, budgets, SPANS_UNPROVEN, failed=True), now=now, sealer=sealer,
                     audit=Audit(Action.NOT_SIGNALLED, by, reason=row.stop_reason, outcome=SPANS_UNPROVEN))
        return

    if row.kill_mode == lc.COOPERATIVE:
        if _set_stage(conn, row, None, lc.Stage.NOT_SIGNALLED, now):
            outcome = f"did not stop {grace} after the cooperative stop; shares its process with {sharing} other runs"
            announce(conn, Outcome.of(Say.COOPERATIVE, AlertKind.ESCALATE.key(row.id), row.id, f=facts, b=budgets,
                                      reason=row.stop_reason, grace_s=daemon.cancel_grace_s, sharing=sharing),
                     now=now, sealer=sealer, audit=Audit(Action.NOT_SIGNALLED, by, reason=row.stop_reason,
                                                         outcome=outcome))
        return

    if row.pid is None or row.pid_create_time is None:
        _fail(conn, row, start, lc.Stage.REFUSED, Action.SIGNAL_REFUSED, "not signalled: the run registered no process identity",
              **common)
        return
    # The identity the daemon attested, never the row's own word; the row only says which run.
    leader, why = verified_leader(conn, row, sealer)
    if leader is None:
        if stage is None or redriven:
            _fail(conn, row, start, lc.Stage.REFUSED, Action.SIGNAL_REFUSED, f"{NOT_ATTESTED} ({why})", **common)
        else:  # signalled once, and its attestation is not valid any more: changed since
            _fail(conn, row, stage, lc.Stage.FAILED, Action.SIGNAL_REFUSED, f"{NOT_ATTESTED} any more ({why})", **common)
        return
    assert sealer is not None  # verified_leader names no one without the daemon's key

    cgroup_dir, orphans = _exec_tree(conn, row, leader, killer, sealer, remembered)
    if stage is None or redriven:
        _first_signal(conn, row, leader, cgroup_dir, orphans, killer=killer, confirmed=confirmed,
                      own_evidence=own_evidence, common=common, start=start)
        return

    targets = _signalled_targets(conn, row, **common) or [leader]
    alive = remaining(killer, [*targets, *orphans], cgroup_dir)
    waited_s = _since(row.signalled_at, now)
    if not alive and cgroup_dir and not killer.alive([leader]):
        remove_empty(cgroup_dir)  # exec, which removes its cgroup, is gone: the daemon does
    if stage == lc.Stage.TERM:
        if not alive:
            _finish(conn, row, lc.Stage.TERM, f"SIGTERM after {grace}; exited within {waited_s:.1f} s", now, by, facts,
                    budgets, escalated=True, sealer=sealer)
        elif waited_s >= daemon.term_grace_s:
            out = killer.kill(leader, row.kill_mode, [*targets, *orphans], cgroup_dir=cgroup_dir)
            if _set_stage(conn, row, lc.Stage.TERM, lc.Stage.KILL, now):
                record(conn, at=now, action=Action.SIGKILL, by=by, run_id=row.id, reason=row.stop_reason,
                       detail=_sealed_detail(sealer, row.id, out.targets), outcome=out.summary())
    elif stage == lc.Stage.KILL:
        if not alive:
            _finish(conn, row, lc.Stage.KILL,
                    f"ignored SIGTERM for {daemon.term_grace_s:g} s; SIGKILL; gone within {waited_s:.1f} s",
                    now, by, facts, budgets, escalated=True, sealer=sealer)
        elif waited_s >= KILL_CONFIRM_S:
            pids = ", ".join(str(t.pid) for t in alive)
            _fail(conn, row, lc.Stage.KILL, lc.Stage.FAILED, Action.STOP_FAILED,
                  f"still alive {waited_s:.0f} s after SIGKILL (pids {pids}; uninterruptible?)", **common)


def _first_signal(conn: Connection, row: RunView, leader: ProcessIdentity, cgroup_dir: Any, orphans: list[Any], *,
                  killer: Killer, confirmed: Callable[[], bool] | None, own_evidence: Callable[[], bool | str] | None,
                  common: dict[str, Any], start: str | None = None) -> None:
    """The ladder's first step (SIGTERM), once the process is checked and the stop confirmed the
    daemon's own; or why there is none (gone, refused, unconfirmed, not the run's own evidence)."""
    now, by, facts, budgets, sealer = common["now"], common["by"], common["facts"], common["budgets"], common["sealer"]
    refusal = killer.refusal(leader)
    if refusal in GONE_REASONS and orphans:
        refusal = None  # exec is gone, its tree is not: the daemon takes it down itself
    if refusal in GONE_REASONS:
        _finish(conn, row, start, f"process exited after the cooperative stop ({refusal})", now, by, facts,
                budgets, escalated=False, sealer=sealer)
        return
    if refusal:
        _fail(conn, row, start, lc.Stage.REFUSED, Action.SIGNAL_REFUSED, f"not signalled: {refusal}", **common)
        return
    if confirmed is not None and not confirmed():
        hold_unconfirmed(conn, row, now=now, by=by, facts=facts, budgets=budgets, sealer=sealer)
        return
    if own_evidence is not None and (own := own_evidence()) is not True:
        hold_not_own(conn, row, what=own if isinstance(own, str) else "", **common)  # what was refused
        return
    out = killer.terminate(leader, row.kill_mode, extra=orphans, cgroup_dir=cgroup_dir)
    if out.refused in GONE_REASONS and out.targets:
        out = dataclasses.replace(out, refused=None)  # exec was gone; its tree got the signal
    if out.refused in GONE_REASONS:  # it exited between the check and the signal
        _finish(conn, row, start, f"process exited after the cooperative stop ({out.refused})", now, by, facts,
                budgets, escalated=False, sealer=sealer)
        return
    if out.refused == PERMISSION_DENIED and not out.targets and start is None:
        hold_denied(conn, row, **common)  # the daemon lacks CAP_KILL: not final, retried each tick
        return
    if out.refused:
        _fail(conn, row, start, lc.Stage.REFUSED, Action.SIGNAL_REFUSED, f"not signalled: {out.refused}", **common)
        return
    if _set_stage(conn, row, start, lc.Stage.TERM, now):
        detail = _sealed_detail(sealer, row.id, out.targets, skipped=list(out.skipped))
        record(conn, at=now, action=Action.SIGTERM, by=by, run_id=row.id, reason=row.stop_reason, detail=detail,
               outcome=out.summary())
