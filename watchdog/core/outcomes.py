"""What the daemon tells a human: the table of outcomes and the one function that words each, the kinds of alert
with their keys and urgency, and how long a title and a body may be.

The table of outcomes: every kind of thing the daemon tells a human, and the one function
that words each. Pure: an outcome (its kind, its dedupe key, its numbers and names) in, the
alert's title and body out. `watchdog.store.alerts.announce` records, words (here), seals
and queues an outcome in one transaction; nothing else queues an alert.

The wording functions apply the rule of writer text (watchdog.core.text): a title is the
daemon's own words, writer text appears in a body only as a marked field.

The alert vocabulary: every kind of alert the daemon queues, its outbox key and its urgency.

An alert's dedupe key is `<kind>:<parts>` (the kind's value, then the identifiers that make
it once: a run id, a host, a time window). The outbox stores each key once, ever, so the key
builder *is* the rule "alerted once per ...": it lives here, with the kind, and nowhere else.

Urgency is apprise's notify type, from the key's first word alone, never the text: failure
for kills and runs lost (a process was signalled, or could not be), warning for stops,
pauses, alarms and open circuits, info for recoveries (a circuit closed, a run resumed) and
the test alert. A key whose first word is no kind (a row from an older version) is a warning.

These words are stored (`alerts.dedupe_key`): they never change spelling.

How long an alert's title and body may be, and what a title may contain. Pure.

Alerts are composed from store strings (an agent's name, a tool's, an error): a title
with a newline or a terminal escape in it would forge a second line in a pager, a mail
subject or a log. So a title is one printable line; a body keeps its lines but no other
control characters. Both are bounded, and a cut is visible: a human reading a truncated
alert must know there was more.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from watchdog.core import drift, messages, money_alerts, outcome_words as words, policies


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
    ROW_LOCK_ENDED = "row_lock_ended"
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
    Say.ROW_LOCK_ENDED: words.row_lock_ended_alert,
    Say.STOPS_SUMMARY: words.stops_summary_alert,
    Say.PAUSE: policies.pause_alert,
    Say.RESUME: policies.resume_alert,
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


# -- The alert vocabulary: every kind of alert the daemon queues, its outbox key and its urgency -------------------

class Urgency(str, Enum):
    FAILURE = "failure"
    WARNING = "warning"
    INFO = "info"

    def __str__(self) -> str:
        return self.value


class AlertKind(str, Enum):
    # One run's stop and its ladder.
    STOP = "stop"
    STOPS = "stops"
    LOST = "lost"
    ESCALATE = "escalate"
    UNCONFIRMED = "unconfirmed"
    NOT_OWN = "notown"
    DENIED = "denied"
    REDRIVE = "redrive"
    FORGED = "forged"
    LOCKED = "locked"
    # Pause and resume.
    PAUSE = "pause"
    RESUME = "resume"
    PAUSE_DENIED = "pause-denied"
    # Alarms about one run.
    RATE = "rate"
    OWNER = "owner"
    QUARANTINE = "quarantine"
    QUARANTINE_MANY = "quarantine-many"
    # Tool circuits.
    CIRCUIT_OPEN = "circuit_open"
    CIRCUIT_CLOSED = "circuit_closed"
    TOOL_RATE = "toolrate"
    # Money.
    BUDGET_WARNING = "budget-warning"
    BUDGET_CLOSED = "budget-closed"
    UNPRICED = "unpriced"
    DRIFT = "drift"
    # The daemons and the store.
    NO_DAEMON = "nodaemon"
    FORGED_ALERTS = "forged-alerts"
    CLOCK = "clock"
    OTLP_FLOOD = "otlp-flood"
    TEST = "test"

    def __str__(self) -> str:
        return self.value

    def key(self, *parts: object) -> str:
        """The dedupe key of one alert of this kind: `<kind>:<part>:<part>...`."""
        return ":".join((self.value, *(str(p) for p in parts)))

    @property
    def urgency(self) -> Urgency:
        if self in _FAILURE:
            return Urgency.FAILURE
        if self in _INFO:
            return Urgency.INFO
        return Urgency.WARNING

    @property
    def meaning(self) -> str:
        """What an alert of this kind tells, and its key's shape."""
        return _MEANING[self]

    @classmethod
    def of_key(cls, dedupe_key: object) -> "AlertKind | None":
        """The kind a stored dedupe key names (its first word), None for an unknown word."""
        word = dedupe_key.split(":", 1)[0] if isinstance(dedupe_key, str) else ""
        try:
            return cls(word)
        except ValueError:
            return None


_FAILURE = frozenset({AlertKind.ESCALATE, AlertKind.DENIED, AlertKind.LOST, AlertKind.NO_DAEMON, AlertKind.FORGED,
                      AlertKind.FORGED_ALERTS, AlertKind.UNCONFIRMED, AlertKind.LOCKED})
_INFO = frozenset({AlertKind.CIRCUIT_CLOSED, AlertKind.RESUME, AlertKind.TEST})


# What each kind tells the on-call, with the shape of its key (the reference docs list these).
_MEANING: dict[AlertKind, str] = {
    AlertKind.STOP: "stop:<run> — the run's one stop alert (daemon, guard, gateway or CLI)",
    AlertKind.STOPS: 'stops:<time>:<first run> — many stops heard after the fact, summarised',
    AlertKind.LOST: 'lost:<run> — its process is gone without ending the run',
    AlertKind.ESCALATE: 'escalate:<run> — SIGKILL, a refused or failed signal, a cooperative run',
    AlertKind.UNCONFIRMED: 'unconfirmed:<run> — a signal held: the kernel cannot confirm the process',
    AlertKind.NOT_OWN: "notown:<run> — a signal held: the evidence is not the run's own",
    AlertKind.DENIED: "denied:<run> — the kernel refused the signal (the daemon lacks CAP_KILL): retried each tick",
    AlertKind.REDRIVE: "redrive:<run>:<time> — an operator's `kill` of a run already stopping: its stop driven again",
    AlertKind.FORGED: "forged:<run>:<what> — a row the daemon's seal does not cover",
    AlertKind.LOCKED: "locked:<run> — another session holds the run's row locked: its step waits, tried each tick; "
                       "locked:<run>:ended:<pid>:<xid> — the daemon ended a writer's session that held it",
    AlertKind.PAUSE: 'pause:<run>:<paused at> — each pause once',
    AlertKind.RESUME: 'resume:<run>:<resumes> — each resume once',
    AlertKind.PAUSE_DENIED: 'pause-denied:<run> — a pause the daemon did not confirm',
    AlertKind.RATE: 'rate:<run>:<window> — a tool-call rate alarm',
    AlertKind.OWNER: 'owner:<run> — a profile its owner may not use',
    AlertKind.QUARANTINE: 'quarantine:run|event:<id> — a row the tick cannot read',
    AlertKind.QUARANTINE_MANY: 'quarantine-many:<daemon>:<window> — past the hourly rate',
    AlertKind.CIRCUIT_OPEN: 'circuit_open:<tool>:<time> — a tool circuit opened: calls to it fail fast',
    AlertKind.CIRCUIT_CLOSED: 'circuit_closed:<tool>:<time> — the tool works again (or was closed by hand)',
    AlertKind.TOOL_RATE: 'toolrate:<tool>:<window> — the all-runs rate of one tool',
    AlertKind.BUDGET_WARNING: 'budget-warning:<scope>:<period>:<period key> — a daily or monthly budget nearly spent',
    AlertKind.BUDGET_CLOSED: 'budget-closed:<scope>:<period>:<period key> — a daily or monthly budget spent: its runs stopped',
    AlertKind.UNPRICED: 'unpriced:<model>:<day> — a model with no price: its tokens are not counted in money',
    AlertKind.DRIFT: 'drift:<agent>:<window> — an agent spends far more than it used to',
    AlertKind.OTLP_FLOOD: 'otlp-flood:<sender>:<day> — an OTLP sender starts too many runs: refused (429)',
    AlertKind.NO_DAEMON: 'nodaemon:<host>:<pid>:<started> | nodaemon:<host>:never',
    AlertKind.FORGED_ALERTS: 'forged-alerts:<host>:<hour> — outbox rows this daemon did not seal',
    AlertKind.CLOCK: 'clock:<host>:<time> — the wall clock jumped',
    AlertKind.TEST: 'test — agent-watchdog test-alert',
}

ALERT_KINDS = tuple(AlertKind)
# The old module's names (watchdog.core.notify_kind): apprise's types by their string.
FAILURE, WARNING, INFO = Urgency.FAILURE, Urgency.WARNING, Urgency.INFO


def notify_kind(dedupe_key: object) -> Urgency:
    """How urgent the alert of this outbox key is for its target (apprise's notify type)."""
    kind = AlertKind.of_key(dedupe_key)
    return kind.urgency if kind is not None else Urgency.WARNING


# -- How long an alert's title and body may be, and what a title may contain. Pure ---------------------------------

MAX_TITLE_CHARS = 300
MAX_BODY_CHARS = 4000
TITLE_MARKER = " …[truncated]"
BODY_MARKER = "\n…[truncated: the full text is in the store]"


def _printable(ch: str, keep: str) -> str:
    if ch in keep:
        return ch
    # Cc (controls, newlines), Cf (bidi overrides, zero-width), Cs/Co/Cn: never shown as is.
    return " " if unicodedata.category(ch).startswith(("C", "Z")) and ch != " " else ch


def bound(text: str, max_chars: int, marker: str) -> str:
    if len(text) <= max_chars:
        return text
    return text[: max_chars - len(marker)].rstrip() + marker  # rstrip: bounding twice changes nothing


def alert_title(title: object) -> str:
    """One printable line of at most MAX_TITLE_CHARS (idempotent: a bounded title is unchanged)."""
    text = "".join(_printable(ch, "") for ch in str(title))
    return bound(" ".join(text.split()), MAX_TITLE_CHARS, TITLE_MARKER)


def alert_body(body: object) -> str:
    """Lines of printable text, at most MAX_BODY_CHARS (idempotent)."""
    text = str(body).replace("\r\n", "\n")
    text = "".join(_printable(ch, "\n\t") for ch in text)
    return bound(text, MAX_BODY_CHARS, BODY_MARKER)
