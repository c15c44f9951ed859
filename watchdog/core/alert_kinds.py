"""The alert vocabulary: every kind of alert the daemon queues, its outbox key and its urgency.

An alert's dedupe key is `<kind>:<parts>` (the kind's value, then the identifiers that make
it once: a run id, a host, a time window). The outbox stores each key once, ever, so the key
builder *is* the rule "alerted once per ...": it lives here, with the kind, and nowhere else.

Urgency is apprise's notify type, from the key's first word alone, never the text: failure
for kills and runs lost (a process was signalled, or could not be), warning for stops,
pauses, alarms and open circuits, info for recoveries (a circuit closed, a run resumed) and
the test alert. A key whose first word is no kind (a row from an older version) is a warning.

These words are stored (`alerts.dedupe_key`): they never change spelling.
"""

from __future__ import annotations

from enum import Enum


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
    AlertKind.LOCKED: "locked:<run> — another session holds the run's row locked: its step waits, tried each tick",
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
