"""What each step of the stop ladder writes: the run's stage, its intervention, its alert.

The enforcer (watchdog.daemon.stops.enforcer) calls these once it has carried a command out
or found why it could not; each stage write is a compare-and-set on the stage the step leaves
(watchdog.store.ladder), in the enforcer's transaction. Nothing here signals or reads the
process table.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from watchdog.core import lifecycle as lc
from watchdog.core.outcomes import AlertKind, Outcome, Say
from watchdog.core.budgets import Budgets
from watchdog.core.interventions import Action
from watchdog.core.messages import RunFacts
from watchdog.core.procid import ProcessIdentity
from watchdog.core.rowviews import RunView
from watchdog.core.seal import Sealer
from watchdog.store import ladder as store
from watchdog.store.alerts import Audit, announce, record
from watchdog.store.engine import Connection

NOT_ATTESTED = "not signalled: identity not attested"
UNCONFIRMED = "not signalled: the stop was requested in the store and the daemon's own budgets do not confirm it"


@dataclass(frozen=True)
class Said:
    """Who writes a step's records and what its alerts may say: the same for every step of one run."""

    now: dt.datetime
    by: str
    facts: RunFacts
    budgets: Budgets
    sealer: Sealer | None = None


def since(t: dt.datetime | None, now: dt.datetime) -> float:
    return (now - t).total_seconds() if t else 0.0


def set_stage(conn: Connection, row: RunView, expected: str | None, stage: str, now: dt.datetime) -> bool:
    return store.set_stage(conn, row.id, expected, stage, signalled_at=now)


def escalation(row: RunView, s: Said, outcome: str, *, failed: bool, key: str | None = None) -> Outcome:
    return Outcome.of(Say.ESCALATION, key or AlertKind.ESCALATE.key(row.id), row.id, f=s.facts, b=s.budgets,
                      reason=row.stop_reason, outcome=outcome, failed=failed)


def finish(conn: Connection, row: RunView, stage_from: str | None, outcome: str, s: Said, *, escalated: bool) -> None:
    if not store.finish(conn, row.id, stage_from, s.now):
        return
    audit = Audit(Action.ENDED, s.by, reason=row.stop_reason, outcome=outcome)
    if not escalated:  # one more alert only when the ladder went past the cooperative stop
        record(conn, at=s.now, action=audit.action, by=s.by, run_id=row.id, reason=audit.reason, outcome=outcome)
        return
    announce(conn, escalation(row, s, outcome, failed=False), now=s.now, sealer=s.sealer, audit=audit)


def fail(conn: Connection, row: RunView, stage_from: str | None, stage_to: str, action: str, outcome: str,
         s: Said) -> None:
    # Refused again on a redrive (issue 36): the stage stays, the refusal is recorded.
    if stage_from != stage_to and not set_stage(conn, row, stage_from, stage_to, s.now):
        return
    announce(conn, escalation(row, s, outcome, failed=True), now=s.now, sealer=s.sealer,
             audit=Audit(action, s.by, reason=row.stop_reason, outcome=outcome))


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
    finish(conn, row, row.signal_stage, _EXITED[row.signal_stage], Said(now, by, facts, budgets, sealer),
           escalated=False)


def hold_unconfirmed(conn: Connection, row: RunView, *, now: dt.datetime, by: str, facts: RunFacts, budgets: Budgets,
                     sealer: Sealer | None = None) -> None:
    """A stop someone wrote into the store (a guard, the CLI, any store writer) that the
    daemon's own budgets do not confirm: no signal, so a row cannot lend anyone the daemon's
    CAP_KILL over another run. The stage stays where it is: the ladder asks again each tick,
    and signals once the daemon's own policies agree (a run that swallowed its stop goes
    silent and trips heartbeat_timeout). Recorded and alerted once."""
    s = Said(now, by, facts, budgets, sealer)
    announce(conn, escalation(row, s, UNCONFIRMED, failed=True, key=AlertKind.UNCONFIRMED.key(row.id)),
             now=now, sealer=sealer, once=True,
             audit=Audit(Action.SIGNAL_HELD, by, reason=row.stop_reason, outcome=UNCONFIRMED))


def _sealable(targets: Iterable[ProcessIdentity]) -> list[tuple[str, int, float, int]]:
    return [(t.host, t.pid, t.create_time, -1 if t.uid is None else t.uid) for t in targets]


def sealed_detail(sealer: Sealer, run_id: str, targets: Sequence[ProcessIdentity], **extra: Any) -> dict[str, Any]:
    return {"targets": [t.to_json() for t in targets], **extra, "mac": sealer.targets(run_id, _sealable(targets))}


def _parse_targets(detail: Any) -> tuple[list[ProcessIdentity], object] | None:
    try:
        d = json.loads(detail)
        return [ProcessIdentity.from_json(t) for t in d["targets"]], d.get("mac")
    except (TypeError, ValueError, KeyError, AttributeError):
        return None


def signalled_targets(conn: Connection, row: RunView, s: Said, sealer: Sealer) -> list[ProcessIdentity]:
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
                       "seal does not verify (not written by this daemon): their targets were ignored", s)
    return found


def _report_forged(conn: Connection, row: RunView, kind: str, what: str, s: Said) -> None:
    """One intervention and one alert per run and kind of forgery, however often it is seen."""
    announce(conn, Outcome.of(Say.FORGED, AlertKind.FORGED.key(row.id, kind), row.id, f=s.facts, b=s.budgets,
                              what=what),
             now=s.now, sealer=s.sealer, once=True,
             audit=Audit(Action.FORGED_ROW, s.by, reason=row.stop_reason, outcome=what[:255]))
