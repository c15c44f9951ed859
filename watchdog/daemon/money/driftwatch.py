"""Drift alarms on the daemon's side: sums of the rolled-up buckets in, one alert per agent per window out.

At most once a minute (of the tick's clock): the window's totals per agent (the last
`window_s` of 5-minute buckets) against the baseline's (the `baseline_days` before),
judged by watchdog.core.drift. The baseline is read again only when the window
moves to a new bucket or the ledger booked runs into the past (a backlog): a few
thousand rollup rows at most, never the events.
"""

from __future__ import annotations

import datetime as dt
import logging
from typing import TYPE_CHECKING

from watchdog.core.outcomes import AlertKind, Outcome, Say, word
from watchdog.core.interventions import Action
from watchdog.core import drift
from watchdog.store.alerts import queued, Audit, announce, queued_at
from watchdog.store.engine import Connection, Engine, read_connection
from watchdog.store.ledger import first_bucket_after, rollup_totals, top_tool

if TYPE_CHECKING:
    from watchdog.core.seal import Sealer

log = logging.getLogger("watchdog.drift")

EVERY_S = 60.0
MAX_REMEMBERED = 10_000


class DriftWatch:
    def __init__(self, cfg: drift.DriftConfig, by: str, sealer: Sealer | None = None) -> None:
        self.cfg = cfg
        self.by = by
        self.sealer = sealer  # the daemon's key: seals the alerts queued here
        self._last: dt.datetime | None = None
        self._baseline: tuple[dt.datetime, dict[str, drift.Totals]] | None = None  # (window start, totals per agent)
        self._alerted: set[str] = set()

    def dirty(self, oldest_booked_bucket: dt.datetime | None, now: dt.datetime) -> None:
        """Runs were booked into a bucket the cached baseline may cover: read it again next time."""
        if (oldest_booked_bucket is not None and self._baseline is not None
                and oldest_booked_bucket < self._baseline[0]):
            self._baseline = None

    def window_start(self, now: dt.datetime) -> dt.datetime:
        return first_bucket_after(now - dt.timedelta(seconds=self.cfg.window_s))

    def check(self, engine: Engine, now: dt.datetime, *, force: bool = False) -> list[str]:
        """Alert the agents that drifted; return their alert lines (the title of each)."""
        if self.cfg.factor <= 0:
            return []
        if not force and self._last is not None and 0 <= (now - self._last).total_seconds() < EVERY_S:
            return []
        self._last = now
        ws = self.window_start(now)
        b0 = ws - dt.timedelta(days=self.cfg.baseline_days)
        with read_connection(engine) as conn:
            window = rollup_totals(conn, ws)
            busy = {a: t for a, t in window.items() if t.runs >= self.cfg.min_runs}
            if not busy:
                return []
            if self._baseline is None or self._baseline[0] != ws:
                self._baseline = (ws, rollup_totals(conn, b0, ws))
            baseline = self._baseline[1]
            found: list[tuple[str, drift.Totals, list[drift.DriftVerdict], tuple[str, int] | None]] = []
            for agent, w in sorted(busy.items()):
                verdicts = drift.evaluate(w, baseline.get(agent, drift.Totals()), self.cfg)
                if verdicts:
                    found.append((agent, w, verdicts, top_tool(conn, agent, ws)))
        lines: list[str] = []
        window_no = int(now.timestamp() // self.cfg.window_s)
        for agent, w, verdicts, top in found:
            key = AlertKind.DRIFT.key(agent, window_no)
            if key in self._alerted:
                continue
            said = Outcome.of(Say.DRIFT, key, agent=agent, verdicts=verdicts, window=w,
                              baseline=baseline.get(agent, drift.Totals()), cfg=self.cfg, top_tool=top)
            first = word(said)[1].splitlines()[0]
            with engine.begin() as conn:
                # Sent already (by a daemon before a restart, or on another host), or sent in the
                # previous window less than a window ago: once per window_s, not per clock hour.
                if queued(conn, key) or _sent_since(conn, AlertKind.DRIFT.key(agent, window_no - 1),
                                                    now - dt.timedelta(seconds=self.cfg.window_s)):
                    self._remember(key)
                    continue
                announce(conn, said, now=now, sealer=self.sealer, audit=Audit(
                    Action.DRIFT_ALARM, self.by, tool=top[0] if top else None, detail=first, outcome="alert only"))
            self._remember(key)
            lines.append(first)
            log.warning("drift %s", first)
        return lines

    def _remember(self, key: str) -> None:
        if len(self._alerted) >= MAX_REMEMBERED:
            self._alerted.clear()
        self._alerted.add(key)


def _sent_since(conn: Connection, key: str, since: dt.datetime) -> bool:
    at = queued_at(conn, key)
    return at is not None and at > since
