"""Rows the tick cannot read or judge: each one costs only itself.

A run whose row holds text where a counter belongs, a timestamp that does not parse or
is not finite, a NaN or negative cost, or an event without a tool is not judged (its
numbers mean nothing) and not allowed to stop the scan of every other run. It is
reported once, as an intervention (`quarantined`) and a sealed alert, and passed over
while it stays bad; a row fixed by hand is judged again at the next tick.

"Once" survives a restart: the alert's dedupe key is checked before anything is written.
The texts are the daemon's own (which column, what kind of problem), never the stored
value, which whoever wrote the row chose.
"""

from __future__ import annotations

import datetime as dt
import logging
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

from watchdog.core.rowviews import RunView
from watchdog.core.outcomes import AlertKind, Outcome, Say
from watchdog.core.interventions import Action
from watchdog.core import lifecycle as lc
from watchdog.core.budgets import RUN_BUDGET_KEYS
from watchdog.core.text import one_line
from watchdog.daemon.trust.scan import Defect, LIGHT, MEASURES
from watchdog.store.alerts import queued, announce, record
from watchdog.store import alerts as store
from watchdog.store.engine import Connection

if TYPE_CHECKING:
    from watchdog.core.seal import Sealer

log = logging.getLogger("watchdog.tick")

QUARANTINED = Action.QUARANTINED
# One alert per bad row, up to this many an hour; past it, the rows are recorded (interventions)
# and one summary alert an hour counts them: 10,000 bad rows are not 10,000 pages.
ALERTS_PER_HOUR = 20
MALFORMED_ROW, MALFORMED_EVENT = "malformed_row", "malformed_event"  # the intervention's reason
# A run older than this, or stamped further than this in the future, has a broken clock
# column, not a long life: 30 years / 1 day.
MAX_AGE_S = 30 * 365 * 86400.0
FUTURE_S = 86400.0
_MEMO_MAX = 10_000


def light_defect(r: Sequence[object], now_s: float) -> str:
    """Name what is wrong with a light row that failed the pre-filter (the failure path only)."""
    problems = []
    for name in ("id", "agent", "status", "host"):
        v = r[LIGHT.index(name)]
        if not isinstance(v, str) or (name != "host" and not v):
            problems.append(f"{name} is not text")
        elif "\ufffd" in v:
            problems.append(f"{name} is not valid UTF-8")
    for name in (*MEASURES, *RUN_BUDGET_KEYS):
        v = r[LIGHT.index(name)]
        if v is None and name not in MEASURES:
            continue  # a budget the run did not set
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            problems.append(f"{name} is not a number")
        elif not math.isfinite(v) or v < 0:
            problems.append(f"{name} is {'negative' if v < 0 else 'not finite'}")
    for name, col in (("started_s", "started_at"), ("seen_s", "last_seen_at")):
        v = r[LIGHT.index(name)]
        if not isinstance(v, (int, float)):
            problems.append(f"{col} is not a timestamp")
        elif not (-FUTURE_S < now_s - v < MAX_AGE_S):
            problems.append(f"{col} is not a plausible time (not finite, far future or far past)")
    return "; ".join(problems) or "its row cannot be judged"


class Malformed(ValueError):
    """A row the daemon cannot act on, with what is wrong in the daemon's own words."""


_STAGES = frozenset(s.value for s in lc.Stage)


def check_actionable(row: RunView) -> None:
    """What the stop ladder reads and the checks would have refused: an unknown kill mode or
    ladder stage would leave a stopping run on a step nobody takes (never escalated, never
    reported)."""
    if row.kill_mode not in lc.KILL_MODES:
        raise Malformed("kill_mode is not one of " + ", ".join(lc.KILL_MODES))
    if row.signal_stage is not None and row.signal_stage not in _STAGES:
        raise Malformed("signal_stage is not a stage of the stop ladder")


class Quarantine:
    """What this daemon reported, so a bad row costs one query at most once per run."""

    def __init__(self, by: str, sealer: Sealer | None = None) -> None:
        self.by = by
        self.sealer = sealer
        self._reported: set[str] = set()
        self.logged: set[str] = set()
        self._window: int | None = None  # the hour the alert count is for
        self._alerts = 0
        self.suppressed = 0  # rows recorded without an alert of their own this hour

    @staticmethod
    def key(d: Defect) -> str:
        rid = d.run_id if isinstance(d.run_id, str) else None
        return AlertKind.QUARANTINE.key("event" if d.event_id is not None else "run", rid or d.event_id)[:255]

    def known(self, d: Defect) -> bool:
        """Already reported by this daemon: nothing to read or write for it this tick."""
        return self.key(d) in self._reported

    def report(self, conn: Connection, d: Defect, now: dt.datetime) -> bool:
        """Record and alert `d` unless its run (or, for an event of no run, the event) already
        was; True if it was reported now."""
        rid = d.run_id if isinstance(d.run_id, str) else None
        key = self.key(d)
        if key in self._reported:
            return False
        if len(self._reported) > _MEMO_MAX:
            self._reported.clear()
        known = _known_run(conn, rid)
        if queued(conn, key) or (known and rid is not None and d.event_id is None and _recorded(conn, rid)):
            self._reported.add(key)
            return False
        window = int(now.timestamp() // 3600)
        if window != self._window:
            self._window, self._alerts, self.suppressed = window, 0, 0
        shown = one_line(rid, 40) if rid else "(none)"
        what = one_line(d.detail, 300)
        log.warning("run %s: %s: quarantined (not judged while it stays so)", shown, what)
        iid = record(conn, at=now, action=QUARANTINED, by=self.by, run_id=rid if known else None,
                     reason=MALFORMED_EVENT if d.event_id is not None else MALFORMED_ROW,
                     detail={"problem": what, "event_id": d.event_id, "run_id": shown},
                     outcome="not judged while the row stays malformed; every other run judged as usual")
        self._reported.add(key)
        if self._alerts >= ALERTS_PER_HOUR:
            self.suppressed += 1
            self._summary(conn, now, window)
            return True
        self._alerts += 1
        announce(conn, Outcome.of(Say.QUARANTINE, key, rid if known else None, shown=shown, what=what,
                                  event_id=d.event_id, has_run=bool(rid)), now=now, sealer=self.sealer, audit=iid)
        return True

    def _summary(self, conn: Connection, now: dt.datetime, window: int) -> None:
        """One alert an hour for the rows past ALERTS_PER_HOUR (its count is the first moment's)."""
        announce(conn, Outcome.of(Say.QUARANTINE_MANY, AlertKind.QUARANTINE_MANY.key(self.by, window)[:255],
                                  per_hour=ALERTS_PER_HOUR), now=now, sealer=self.sealer)


def _recorded(conn: Connection, rid: str) -> bool:
    """This run's quarantine was recorded before (an intervention, with or without its alert)."""
    return store.recorded(conn, rid, action=QUARANTINED, reason=MALFORMED_ROW)


def _known_run(conn: Connection, rid: str | None) -> bool:
    """The foreign keys accept only a run that exists (an event may name none)."""
    if rid is None:
        return False
    return store.run_exists(conn, rid)
