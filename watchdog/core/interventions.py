"""The intervention vocabulary: every `interventions.action` the daemon, the SDK's guards,
a gateway or the CLI writes, in one place.

These strings are part of the table contract (`agent-watchdog show`, the web view and
scripts read them), so they never change spelling. A member *is* its string (a str Enum):
it binds to SQL and compares equal with what a row holds.
"""

from __future__ import annotations

from enum import Enum


class Action(str, Enum):
    # A run's stop and its ladder (watchdog.daemon.stops.stopping, watchdog.daemon.stops.ladder).
    STOP_REQUESTED = "stop_requested"
    GUARD_STOP = "guard_stop"  # an in-process guard's own stop as older versions recorded it (read, not written)
    SIGTERM = "sigterm"
    SIGKILL = "sigkill"
    SIGNAL_REFUSED = "signal_refused"  # the killer would not signal (identity, user, not attested)
    NOT_SIGNALLED = "not_signalled"  # a cooperative run: never signalled
    SIGNAL_HELD = "signal_held"  # a signal waits for evidence the daemon believes
    STOP_FAILED = "stop_failed"  # alive after SIGKILL
    STOP_REDRIVEN = "stop_redriven"  # an operator's sealed `kill` of a run already stopping
    ENDED = "ended"  # the stopped run is over
    LOST = "lost"  # its process is gone without ending the run
    FORGED_ROW = "forged_row"  # a row the daemon's seal does not cover
    # Pause and resume.
    PAUSED = "paused"
    RESUMED = "resumed"
    PAUSE_DENIED = "pause_denied"  # a pause the daemon neither wrote nor confirms
    # Alarms and refusals about one run.
    RATE_ALARM = "rate_alarm"
    PROFILE_REFUSED = "profile_refused"
    QUARANTINED = "quarantined"
    # A writer's session the daemon ended for keeping a run's row locked from it (no run column:
    # its foreign key would wait on that lock; the detail names the run).
    SESSION_ENDED = "session_ended"
    # Tool circuits (no run).
    CIRCUIT_OPEN = "circuit_open"
    CIRCUIT_HALF_OPEN = "circuit_half_open"
    CIRCUIT_CLOSED = "circuit_closed"
    # The store as a whole (no run).
    BUDGET_WARNING = "budget_warning"
    BUDGET_CLOSED = "budget_closed"
    DRIFT_ALARM = "drift_alarm"
    NO_DAEMON = "no_daemon"

    def __str__(self) -> str:  # f-strings and logs show the stored word, never "Action.X"
        return self.value

    @classmethod
    def budget(cls, kind: str) -> "Action":
        """A period budget's alert `kind` ("warning" / "closed") as its action."""
        return cls(f"budget_{kind}")


# Every action that asks a run to stop (the demo's and the web view's "stops").
STOP_ACTIONS = frozenset({Action.STOP_REQUESTED, Action.GUARD_STOP})
# The stop ladder's steps, in the order they may happen (the web view's ladder table).
LADDER_ACTIONS = (Action.STOP_REQUESTED, Action.SIGTERM, Action.SIGKILL, Action.SIGNAL_REFUSED,
                  Action.NOT_SIGNALLED, Action.STOP_FAILED, Action.LOST, Action.ENDED)
ACTIONS = tuple(Action)
