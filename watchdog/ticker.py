"""`Ticker.tick(now)`: one scan of the active runs. The daemon's whole job, drivable from tests.

Cost per tick: O(active runs + events since the last tick). Stop requests are
written before any alert is delivered, so a slow alert target never delays a stop.
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from collections import Counter
from dataclasses import dataclass, field

from sqlalchemy import update
from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeoutError

from . import lifecycle as lc
from .actions import actor, enqueue_alert, facts, mark_lost, queued, record, request_stop
from .config import Config
from .killer import Killer, ProcessIdentity
from .ladder import WAITING_STAGES, advance, exited
from .messages import rate_alert
from .policies import evaluate, rate_alarm
from .scan import RATE_WINDOW_S, Scanner
from .store import daemons, read_connection
from .views import effective_budgets

log = logging.getLogger("watchdog.tick")


def store_unavailable(exc: BaseException) -> bool:
    """The store is down, unreachable or locked (as opposed to one row being bad)."""
    if isinstance(exc, (OperationalError, InterfaceError, PoolTimeoutError)):
        return True
    return isinstance(exc, DBAPIError) and exc.connection_invalidated


@dataclass
class TickReport:
    at: dt.datetime
    active: int = 0
    stopping: int = 0
    new_events: int = 0
    stops: list = field(default_factory=list)  # (run id, reason)
    lost: list = field(default_factory=list)
    alarms: list = field(default_factory=list)
    events: list = field(default_factory=list)  # the tool events folded this tick
    duration_s: float = 0.0


class Ticker:
    def __init__(self, engine, config: Config, killer: Killer, *, circuits=None, by: str | None = None):
        self.engine = engine
        self.config = config
        self.killer = killer
        self.circuits = circuits  # watchdog.circuits.CircuitBreakers, optional
        self.by = by or actor()
        self.scanner = Scanner()
        self._rate_alarmed: dict[str, dt.datetime] = {}

    def tick(self, now: dt.datetime) -> TickReport:
        t0 = time.perf_counter()
        rep = TickReport(at=now)
        with self._read_snapshot() as conn:
            rows = self.scanner.load_active(conn)
            new = self.scanner.fold(conn, [r.id for r in rows])
        rep.new_events = len(new)
        rep.events = new
        rep.active = len(rows)
        live = self._live_pids()
        sharing = Counter((r.host, r.pid) for r in rows)
        for row in rows:
            try:
                self._one(row, now, rep, live, sharing)
            except Exception as exc:  # one bad row must not stop the scan of the others...
                if store_unavailable(exc):
                    raise  # ...but a store that is down or locked fails them all: retry the whole tick
                log.exception("run %s: evaluation failed; skipped this tick", row.id)
        if self.circuits is not None:
            self.circuits.update(self.engine, new, now, self.scanner)
        self._touch_lease(now)
        rep.duration_s = time.perf_counter() - t0
        return rep

    # -- one run -------------------------------------------------------------

    def _one(self, row, now, rep, live, sharing):
        budgets = effective_budgets(self.config.profile(row.agent), row)
        st = self.scanner.stats.get(row.id)
        top = st.top_tool() if st else None
        f = facts(row, top, st.last_error.get(top[0]) if (st and top) else None, now)
        if row.status == lc.STOPPING:
            rep.stopping += 1
            with self.engine.begin() as conn:
                if row.signal_stage in (None, *WAITING_STAGES) and self._gone(row, live, now):
                    # It ended without saying so: after the cooperative stop (no need to wait for the
                    # grace), or after a signal that was refused / not allowed / did not work.
                    exited(conn, row, now=now, by=self.by, facts=f, budgets=budgets)
                    return
                advance(conn, row, killer=self.killer, daemon=self.config.daemon, budgets=budgets, facts=f,
                        now=now, by=self.by, sharing=sharing[(row.host, row.pid)] - 1)
            return
        if self._gone(row, live, now):
            with self.engine.begin() as conn:
                if mark_lost(conn, row, detail=f"process {row.pid} on {row.host} is gone without ending the run",
                             now=now, by=self.by, budgets=budgets, run_facts=f):
                    rep.lost.append(row.id)
            return
        snap = self.scanner.snapshot(row, now)
        verdicts = evaluate(snap, budgets, now)
        if verdicts:
            v = verdicts[0]
            with self.engine.begin() as conn:
                if request_stop(conn, row, reason=v.reason, detail=v.detail, now=now, by=self.by, budgets=budgets,
                                run_facts=f):
                    rep.stops.append((row.id, v.reason))
                    log.warning("stop requested: %s run %s — %s (%s)", row.agent, row.id[:8], v.reason, v.detail)
            return
        alarm = rate_alarm(snap, budgets, now)
        if alarm:
            self._alarm(row, alarm, snap, budgets, f, now, rep)

    def _alarm(self, row, alarm, snap, budgets, f, now, rep):
        # One alarm per run per rate window.
        last = self._rate_alarmed.get(row.id)
        if last and (now - last).total_seconds() < RATE_WINDOW_S:
            return
        self._rate_alarmed[row.id] = now
        window = int(now.timestamp() // RATE_WINDOW_S)
        title, body = rate_alert(f, budgets, snap.calls_last_min, snap.top_tool_last_min, stopping=False)
        with self.engine.begin() as conn:
            if queued(conn, f"rate:{row.id}:{window}"):
                return  # a daemon before a restart already alarmed this minute
            iid = record(conn, at=now, action="rate_alarm", by=self.by, run_id=row.id,
                         tool=snap.top_tool_last_min[0] if snap.top_tool_last_min else None,
                         reason=lc.TOOL_RATE, detail=alarm.detail, outcome="alert only")
            if enqueue_alert(conn, f"rate:{row.id}:{window}", title, body, now=now, run_id=row.id,
                             intervention_id=iid):
                rep.alarms.append(row.id)

    def _read_snapshot(self):
        """One snapshot for the active runs and their new events: a run started between the
        two reads must not have its first events folded (and marked seen) while not yet active."""
        return read_connection(self.engine)

    # -- processes -------------------------------------------------------------

    def _live_pids(self) -> set[int] | None:
        try:
            import psutil

            return set(psutil.pids())
        except Exception:  # noqa: BLE001 — no process table: never call a run lost for it
            return None

    def _gone(self, row, live, now) -> bool:
        """The run's registered process on this host no longer exists (or is another process)."""
        if live is None or row.host != self.killer.host or not row.pid or row.pid_create_time is None:
            return False
        if row.pid not in live:
            return True
        if (now - row.last_seen_at).total_seconds() < 2 * self.config.daemon.tick_s:
            return False  # it wrote moments ago: skip the /proc read (the expensive part at 10k runs)
        ident = ProcessIdentity(row.host, row.pid, row.pid_create_time)
        return not self.killer.alive([ident])

    def _touch_lease(self, now):
        try:
            with self.engine.begin() as conn:
                conn.execute(update(daemons).where(daemons.c.host == self.killer.host)
                             .values(last_tick_at=now, last_event_id=self.scanner.high_water))
        except Exception:  # noqa: BLE001 — bookkeeping only
            log.debug("could not update the daemon lease", exc_info=True)
