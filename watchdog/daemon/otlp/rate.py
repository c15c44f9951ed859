"""New runs per sender per minute (`[otlp] max_new_runs_per_min`): a sliding window, and its one alert.

One user posting each trace complete in its own request would otherwise start a run per
request, thousands a second, and never meet the cap on active runs. Past the rate the
receiver answers 429 (OTLP exporters back off and retry) and alerts once per sender and day.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections import deque
from collections.abc import Hashable

from watchdog.core.outcomes import AlertKind, Outcome, Say
from watchdog.core.seal import Sealer
from watchdog.core.text import one_line
from watchdog.store.alerts import announce
from watchdog.store.engine import Connection

log = logging.getLogger("watchdog.otlp")

MAX_SENDERS = 10_000  # senders remembered (the oldest window is dropped first)
SENDER_SHOWN_CHARS = 63


class Window:
    """At most `limit` admissions per `span_s` seconds per key (times from the caller's clock)."""

    def __init__(self, limit: int, span_s: float) -> None:
        self.limit = limit
        self.span_s = span_s
        self._times: dict[Hashable, deque[float]] = {}

    def admit(self, key: Hashable, now_s: float) -> bool:
        times = self._times.get(key)
        if times is None:
            if len(self._times) >= MAX_SENDERS:
                self._times.pop(next(iter(self._times)))
            times = self._times[key] = deque()
        while times and now_s - times[0] >= self.span_s:
            times.popleft()
        if len(times) >= self.limit:
            return False
        times.append(now_s)
        return True


def alert_flood(conn: Connection, sealer: Sealer | None, who: str, limit: int, now: dt.datetime) -> None:
    """Once per sender and day: the receiver refuses its new runs (429)."""
    shown = one_line(who)[:SENDER_SHOWN_CHARS]
    key = AlertKind.OTLP_FLOOD.key(shown, now.date().isoformat())
    if announce(conn, Outcome.of(Say.OTLP_FLOOD, key, sender=shown, limit=limit), now=now, sealer=sealer).queued:
        log.warning("otlp: sender %s starts more than %d runs a minute: refused (429)", shown, limit)
