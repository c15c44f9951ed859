"""How urgent an alert is for its target (apprise's notify type), from its outbox key alone:
failure for kills and runs lost (a process was signalled, or could not be), warning for stops,
pauses, alarms and open circuits, info for recoveries (a circuit closed, a run resumed) and
the test alert. Pure: the key's first word decides, never the text."""

from __future__ import annotations

FAILURE, WARNING, INFO = "failure", "warning", "info"

_FAILURE = {"escalate", "lost", "nodaemon", "forged", "forged-alerts", "unconfirmed"}
_INFO = {"circuit_closed", "resume", "test"}


def notify_kind(dedupe_key: str) -> str:
    word = dedupe_key.split(":", 1)[0] if isinstance(dedupe_key, str) else ""
    if word in _FAILURE:
        return FAILURE
    if word in _INFO:
        return INFO
    return WARNING
