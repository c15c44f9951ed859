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
    STOP = "stop"  # stop:<run> — the run's one stop alert (daemon, guard, gateway or CLI)
    STOPS = "stops"  # stops:<time>:<first run> — many stops heard after the fact, summarised
    LOST = "lost"  # lost:<run> — its process is gone without ending the run
    ESCALATE = "escalate"  # escalate:<run> — SIGKILL, a refused or failed signal, a cooperative run
    UNCONFIRMED = "unconfirmed"  # unconfirmed:<run> — a signal held: the kernel cannot confirm the process
    NOT_OWN = "notown"  # notown:<run> — a signal held: the evidence is not the run's own
    FORGED = "forged"  # forged:<run>:<what> — a row the daemon's seal does not cover
    # Pause and resume.
    PAUSE = "pause"  # pause:<run>:<paused at> — each pause once
    RESUME = "resume"  # resume:<run>:<resumes> — each resume once
    PAUSE_DENIED = "pause-denied"  # pause-denied:<run> — a pause the daemon did not confirm
    # Alarms about one run.
    RATE = "rate"  # rate:<run>:<window> — a tool-call rate alarm
    OWNER = "owner"  # owner:<run> — a profile its owner may not use
    QUARANTINE = "quarantine"  # quarantine:run|event:<id> — a row the tick cannot read
    QUARANTINE_MANY = "quarantine-many"  # quarantine-many:<daemon>:<window> — past the hourly rate
    # Tool circuits.
    CIRCUIT_OPEN = "circuit_open"  # circuit_open:<tool>:<time>
    CIRCUIT_CLOSED = "circuit_closed"  # circuit_closed:<tool>:<time>
    TOOL_RATE = "toolrate"  # toolrate:<tool>:<window> — the all-runs rate of one tool
    # Money.
    BUDGET_WARNING = "budget-warning"  # budget-warning:<scope>:<period>:<period key>
    BUDGET_CLOSED = "budget-closed"  # budget-closed:<scope>:<period>:<period key>
    UNPRICED = "unpriced"  # unpriced:<model>:<day>
    DRIFT = "drift"  # drift:<agent>:<window>
    # The daemons and the store.
    NO_DAEMON = "nodaemon"  # nodaemon:<host>:<pid>:<started> | nodaemon:<host>:never
    FORGED_ALERTS = "forged-alerts"  # forged-alerts:<host>:<hour> — outbox rows this daemon did not seal
    CLOCK = "clock"  # clock:<host>:<time> — the wall clock jumped
    TEST = "test"  # agent-watchdog test-alert

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

    @classmethod
    def of_key(cls, dedupe_key: object) -> "AlertKind | None":
        """The kind a stored dedupe key names (its first word), None for an unknown word."""
        word = dedupe_key.split(":", 1)[0] if isinstance(dedupe_key, str) else ""
        try:
            return cls(word)
        except ValueError:
            return None


_FAILURE = frozenset({AlertKind.ESCALATE, AlertKind.LOST, AlertKind.NO_DAEMON, AlertKind.FORGED,
                      AlertKind.FORGED_ALERTS, AlertKind.UNCONFIRMED})
_INFO = frozenset({AlertKind.CIRCUIT_CLOSED, AlertKind.RESUME, AlertKind.TEST})

ALERT_KINDS = tuple(AlertKind)
# The old module's names (watchdog.core.notify_kind): apprise's types by their string.
FAILURE, WARNING, INFO = Urgency.FAILURE, Urgency.WARNING, Urgency.INFO


def notify_kind(dedupe_key: object) -> Urgency:
    """How urgent the alert of this outbox key is for its target (apprise's notify type)."""
    kind = AlertKind.of_key(dedupe_key)
    return kind.urgency if kind is not None else Urgency.WARNING
