"""The table of outcomes: every kind of thing the daemon tells a human, and the one function
that words each. Pure: an outcome (its kind, its dedupe key, its numbers and names) in, the
alert's title and body out. `watchdog.store.alerts.announce` records, words (here), seals
and queues an outcome in one transaction; nothing else queues an alert.

The wording functions apply the rule of writer text (watchdog.core.marked): a title is the
daemon's own words, writer text appears in a body only as a marked field.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from watchdog.core import drift, messages, money_alerts, outcome_words as words, pause


class Say(str, Enum):
    """The kinds of outcome (what happened), each worded by one function of TABLE."""

    # One run's stop and its ladder.
    STOP = "stop"
    REQUESTED_STOP = "requested_stop"
    ESCALATION = "escalation"
    COOPERATIVE = "cooperative"
    LOST = "lost"
    FORGED = "forged"
    REDRIVE = "redrive"
    UNREADABLE_STOP = "unreadable_stop"
    UNREADABLE_LOST = "unreadable_lost"
    ROW_LOCKED = "row_locked"
    STOPS_SUMMARY = "stops_summary"
    # Pause and resume.
    PAUSE = "pause"
    RESUME = "resume"
    PAUSE_DENIED = "pause_denied"
    # Alarms about one run.
    RATE = "rate"
    OWNER = "owner"
    QUARANTINE = "quarantine"
    QUARANTINE_MANY = "quarantine_many"
    # Tool circuits.
    CIRCUIT_OPEN = "circuit_open"
    CIRCUIT_REOPEN = "circuit_reopen"
    CIRCUIT_CLOSED = "circuit_closed"
    TOOL_RATE = "tool_rate"
    # Money.
    PERIOD = "period"
    UNPRICED = "unpriced"
    DRIFT = "drift"
    # The daemons and the store.
    NO_DAEMON = "no_daemon"
    FORGED_ALERTS = "forged_alerts"
    CLOCK = "clock"
    OTLP_FLOOD = "otlp_flood"
    SESSION_CLAIMED = "session_claimed"

    def __str__(self) -> str:
        return self.value


Words = Callable[..., tuple[str, str]]

TABLE: Mapping[Say, Words] = {
    Say.STOP: messages.stop_alert,
    Say.REQUESTED_STOP: messages.requested_stop_alert,
    Say.ESCALATION: messages.escalation_alert,
    Say.COOPERATIVE: messages.cooperative_alert,
    Say.LOST: messages.lost_alert,
    Say.FORGED: messages.forged_alert,
    Say.REDRIVE: words.redrive_alert,
    Say.UNREADABLE_STOP: words.unreadable_stop_alert,
    Say.UNREADABLE_LOST: words.unreadable_lost_alert,
    Say.ROW_LOCKED: words.row_locked_alert,
    Say.STOPS_SUMMARY: words.stops_summary_alert,
    Say.PAUSE: pause.pause_alert,
    Say.RESUME: pause.resume_alert,
    Say.PAUSE_DENIED: words.pause_denied_alert,
    Say.RATE: messages.rate_alert,
    Say.OWNER: words.owner_alert,
    Say.QUARANTINE: words.quarantine_alert,
    Say.QUARANTINE_MANY: words.quarantine_many_alert,
    Say.CIRCUIT_OPEN: words.circuit_open_alert,
    Say.CIRCUIT_REOPEN: words.circuit_reopen_alert,
    Say.CIRCUIT_CLOSED: words.circuit_closed_alert,
    Say.TOOL_RATE: words.tool_rate_alert,
    Say.PERIOD: money_alerts.period_alert,
    Say.UNPRICED: money_alerts.unpriced_alert,
    Say.DRIFT: drift.alert,
    Say.NO_DAEMON: messages.no_daemon_alert,
    Say.FORGED_ALERTS: words.forged_alerts_alert,
    Say.CLOCK: words.clock_alert,
    Say.OTLP_FLOOD: words.otlp_flood_alert,
    Say.SESSION_CLAIMED: words.session_claimed_alert,
}


@dataclass(frozen=True)
class Outcome:
    """What happened, as the daemon tells it: `say` picks the wording, `numbers` are its
    arguments (the run's facts, budgets, counts, names), `key` makes the alert once, ever."""

    say: Say
    key: str
    numbers: Mapping[str, Any] = field(default_factory=dict)
    run_id: str | None = None

    @classmethod
    def of(cls, say: Say, key: str, run_id: str | None = None, /, **numbers: Any) -> "Outcome":
        """An outcome, its wording's arguments given by name."""
        return cls(say, key, numbers, run_id)


def word(o: Outcome) -> tuple[str, str]:
    """The alert's title and body for this outcome (not yet bounded: the outbox bounds both)."""
    return TABLE[o.say](**o.numbers)
