"""The stop ladder for runs in `stopping`: cooperative stop → SIGTERM → SIGKILL.

Its state lives on the run row (`signal_stage`, `signalled_at`), in the daemon's
state file (the stages it reached: watchdog.daemon.trust.ownstage) and in the
interventions (the SIGTERM row keeps the identities signalled, sealed), so a
daemon restarted at any moment continues exactly where the last one was, once.
The killer decides nothing. The decision and its execution are two roles with a typed seam:
the judge (watchdog.daemon.stops.commands.judge, pure: the row and the clock) says which step
is due as a list of Commands; this host's enforcer (watchdog.daemon.stops.enforcer) attests
the processes and carries each one out at most once, through the killer; what a step writes
is watchdog.daemon.stops.steps. Today's daemon runs the two in one process: the tick's judge step
(watchdog.daemon.tick.stopping_runs) makes the list, and the Ticker's own Enforcer executes it.

Whom it may signal is never read from a writable row on its word: the leader is
the identity this host's daemon attested (`attest.verified_leader`, MAC
checked), the rest are what the killer enumerates from that leader, plus the
SIGTERM's targets only when their seal verifies. A run without a valid
attestation is stopped cooperatively and alerted, never signalled.
"""

from __future__ import annotations

from watchdog.core import lifecycle as lc
from watchdog.daemon.stops.commands import KILL_CONFIRM_S, due
from watchdog.daemon.stops.enforcer import Remembered
from watchdog.daemon.stops.steps import NOT_ATTESTED, UNCONFIRMED, exited, hold_unconfirmed

__all__ = ["KILL_CONFIRM_S", "NOT_ATTESTED", "UNCONFIRMED", "WAITING_STAGES", "Remembered", "due", "exited",
           "hold_unconfirmed"]

# Stages where the ladder has nothing more to send but the run is still `stopping`:
# the tick ends such a run once its process is gone, so it never stays active forever.
WAITING_STAGES = lc.WAITING_STAGES
