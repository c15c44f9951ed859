"""The stop ladder for runs in `stopping`: cooperative stop → SIGTERM → SIGKILL.

Its state lives on the run row (`signal_stage`, `signalled_at`), in the daemon's
state file (the stages it reached: watchdog.daemon.trust.ownstage) and in the
interventions (the SIGTERM row keeps the identities signalled, sealed), so a
daemon restarted at any moment continues exactly where the last one was, once.
The killer decides nothing. The decision and its execution are two roles with a typed seam:
the judge (watchdog.daemon.stops.commands.judge, pure: the row and the clock) says which step
is due as a list of Commands; this host's enforcer (watchdog.daemon.stops.enforcer) attests
the processes and carries each one out at most once, through the killer; what a step writes
is watchdog.daemon.stops.steps. advance() is the two in one process, as today's daemon runs.

Whom it may signal is never read from a writable row on its word: the leader is
the identity this host's daemon attested (`attest.verified_leader`, MAC
checked), the rest are what the killer enumerates from that leader, plus the
SIGTERM's targets only when their seal verifies. A run without a valid
attestation is stopped cooperatively and alerted, never signalled.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable

from watchdog.core import lifecycle as lc
from watchdog.core.budgets import Budgets
from watchdog.core.config import DaemonConfig
from watchdog.core.messages import RunFacts
from watchdog.core.rowviews import RunView
from watchdog.core.seal import Sealer
from watchdog.daemon.stops.commands import KILL_CONFIRM_S, due, judge
from watchdog.daemon.stops.enforcer import Checks, Enforcer, Remembered
from watchdog.daemon.stops.killer import Killer
from watchdog.daemon.stops.steps import NOT_ATTESTED, UNCONFIRMED, Said, exited, hold_unconfirmed
from watchdog.store.engine import Connection
from watchdog.store.memory import Memory

__all__ = ["KILL_CONFIRM_S", "NOT_ATTESTED", "UNCONFIRMED", "WAITING_STAGES", "Remembered", "advance", "due",
           "exited", "hold_unconfirmed"]

# Stages where the ladder has nothing more to send but the run is still `stopping`:
# the tick ends such a run once its process is gone, so it never stays active forever.
WAITING_STAGES = lc.WAITING_STAGES


def advance(conn: Connection, row: RunView, *, killer: Killer, daemon: DaemonConfig, budgets: Budgets, facts: RunFacts,
            now: dt.datetime, by: str, sharing: int, sealer: Sealer | None = None,
            confirmed: Callable[[], bool] | None = None, remembered: Remembered | None = None,
            own_evidence: Callable[[], bool | str] | None = None, redriven: bool = False,
            memory: Memory | None = None) -> None:
    """Take the next step of the ladder for one stopping run, if its time has come: the judge's
    commands for it, carried out by this host's enforcer.
    `remembered(leader)`: the processes the daemon attributes to an exec'd run's attested root
    (watchdog.daemon.stops.runtree.TreeMemory), which outlive exec's death.
    `own_evidence()` (SQLite: watchdog.daemon.trust.authentic; PostgreSQL: watchdog.daemon.trust.owned): may
    the first signal rest on the run's own evidence (True; else False or what was refused)? If
    not, the run stays stopped cooperatively, alerted as such.
    `redriven`: a refused run the operator's sealed `kill` drove again (watchdog.daemon.stops.redrive):
    the first step is taken again from `refused`.
    `memory`: the daemon's state file, where the enforcer's exactly-once key is kept with the row."""
    commands = judge(row, now, daemon, killer.host, redriven=redriven)
    if not commands:
        return
    checks = Checks(Said(now, by, facts, budgets, sealer), daemon.cancel_grace_s, daemon.term_grace_s,
                    sharing=sharing, confirmed=confirmed, own_evidence=own_evidence, remembered=remembered)
    enforcer = Enforcer(killer, memory)
    for command in commands:
        enforcer.execute(conn, command, row, checks)
